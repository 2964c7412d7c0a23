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
if older > 0 then return {0, older, 0, 0, 0, 0} end
if ARGV[2] == 'auto' then
  if redis.call('EXISTS', KEYS[5]) == 1 then return {0, 0, 0, 0, 1, 0} end
else
  redis.call('DEL', KEYS[5])
end
-- The marks hold the server's time in µs, in decimal.
local us = t[1] .. string.format('%06d', tonumber(t[2]))
local marks, already = {}, 1
for _, i in ipairs({3, 4, 6}) do
  local was = redis.call('GET', KEYS[i])
  if not was then
    redis.call('SET', KEYS[i], us)
    was, already = us, 0
  end
  marks[i] = tonumber(was)
end
return {marks[3], 0, already, marks[4], 0, marks[6]}
