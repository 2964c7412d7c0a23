-- unmarkScript (finalize.go): Unfinalize's second removal of the marks.
for i = 1, #KEYS do
  if ARGV[i] ~= '' and redis.call('GET', KEYS[i]) == ARGV[i] then redis.call('DEL', KEYS[i]) end
end
return 0
