-- resetScript (admin.go): deletes a key's records and marks the reset
-- for give-backs (giveback.go).
if #KEYS > 1 then redis.call('DEL', unpack(KEYS, 2)) end
local t = redis.call('TIME')
local ttl = math.max(tonumber(ARGV[1]), redis.call('PTTL', KEYS[1]))
redis.call('SET', KEYS[1], t[1] .. string.format('%06d', tonumber(t[2])), 'PX', ttl)
return 1
