-- heartbeatScript (replicas.go): a replica's heartbeat; its keys,
-- arguments and reply are described there.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
-- The dataset's token, written where there is none.
local ds = redis.call('GET', KEYS[4])
if not ds then
  ds = ARGV[5]
  redis.call('SET', KEYS[4], ds)
end
-- A new token: the dataset this replica read is gone; set the mark and the
-- hold it held then again where missing.
local restored = 0
if ARGV[4] ~= '' and ARGV[4] ~= ds then
  if ARGV[3] ~= '' and redis.call('SET', KEYS[3], ARGV[3], 'NX') then restored = 1 end
  if ARGV[6] ~= '' then redis.call('SET', KEYS[5], ARGV[6], 'NX') end
end
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - ttl)
  redis.call('PEXPIRE', KEYS[i], 2 * ttl)
end
local n = redis.call('ZCARD', KEYS[1])
local older = n - redis.call('ZCARD', KEYS[2])
if older < 0 then older = 0 end
return {n, older, redis.call('GET', KEYS[3]) or '', t[1] .. string.format('%06d', tonumber(t[2])), ds, restored,
  redis.call('GET', KEYS[5]) or ''}
