-- unmarkScript (finalize.go): Unfinalize's second removal of the mark.
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
