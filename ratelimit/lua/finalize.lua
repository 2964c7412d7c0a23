-- finalizeScript (finalize.go): finalizes where no replica of an older
-- release is live; its keys, arguments and reply are described there.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
-- The censuses are scored by the replicas' last heartbeats (ms).
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
local older = redis.call('ZCARD', KEYS[1]) - redis.call('ZCARD', KEYS[2])
if older < 0 then older = 0 end
if older > 0 then return {0, older, 0, 0} end
if ARGV[2] == 'auto' then
  if redis.call('EXISTS', KEYS[4]) == 1 then return {0, 0, 0, 1} end
else
  redis.call('DEL', KEYS[4])
end
-- The mark holds the server's time in µs, in decimal.
local was = redis.call('GET', KEYS[3])
if was then return {tonumber(was), 0, 1, 0} end
local us = t[1] .. string.format('%06d', tonumber(t[2]))
redis.call('SET', KEYS[3], us)
return {tonumber(us), 0, 0, 0}
