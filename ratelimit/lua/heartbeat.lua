-- heartbeatScript (replicas.go): a replica's heartbeat; its keys,
-- arguments and reply are described there.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
-- The dataset's token, written where there is none.
local ds = redis.call('GET', KEYS[6])
if not ds then
  ds = ARGV[6]
  redis.call('SET', KEYS[6], ds)
end
-- A new token: the dataset this replica read is gone; set the marks and
-- the hold it held then again where missing.
local restored = 0
if ARGV[5] ~= '' and ARGV[5] ~= ds then
  for i = 3, 4 do
    if ARGV[i] ~= '' and redis.call('SET', KEYS[i + 1], ARGV[i], 'NX') then restored = 1 end
  end
  if ARGV[8] ~= '' and redis.call('SET', KEYS[9], ARGV[8], 'NX') then restored = 1 end
  if ARGV[7] ~= '' then redis.call('SET', KEYS[7], ARGV[7], 'NX') end
end
for _, i in ipairs({1, 2, 3, 8}) do
  redis.call('ZADD', KEYS[i], now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - ttl)
  redis.call('PEXPIRE', KEYS[i], 2 * ttl)
end
local n = redis.call('ZCARD', KEYS[1])
local older = n - redis.call('ZCARD', KEYS[2])
if older < 0 then older = 0 end
local older2 = n - redis.call('ZCARD', KEYS[3])
if older2 < 0 then older2 = 0 end
local older3 = n - redis.call('ZCARD', KEYS[8])
if older3 < 0 then older3 = 0 end
return {n, older, older2, redis.call('GET', KEYS[4]) or '', redis.call('GET', KEYS[5]) or '', t[1] .. string.format('%06d', tonumber(t[2])), ds, restored, redis.call('GET', KEYS[7]) or '',
  older3, redis.call('GET', KEYS[9]) or ''}
