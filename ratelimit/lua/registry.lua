-- registryScript (registry.go): marks the periods a replica decided
-- under lately and reads back the fleet's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- ARGV: pairs of field and the marking replica's limit for it. The
-- limit kept is the largest marked within the last 10 s.
for i = 1, #ARGV, 2 do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local first, lim = now, tonumber(ARGV[i + 1])
  if v then
    local f, l, m = string.match(v, '^(%d+):(%d+):?(%d*)$')
    first = tonumber(f) or now
    m = tonumber(m)
    if m and tonumber(l) and tonumber(l) + 10000 > now and m > lim then lim = m end
  end
  redis.call('HSET', KEYS[1], ARGV[i], first .. ':' .. now .. ':' .. lim)
end
local all = redis.call('HGETALL', KEYS[1])
local out = {now}
local keep = 0
for i = 1, #all, 2 do
  local f = all[i]
  local first, last, lim = string.match(all[i + 1], '^(%d+):(%d+):?(%d*)$')
  first, last, lim = tonumber(first), tonumber(last), tonumber(lim) or 0
  local p = tonumber(string.match(f, '/(%d+)$'))
  -- A period's records are gone a period (and two buckets) after its last
  -- admission; keep the field a little longer.
  if not p or not last or last + math.ceil(p / 1000) * 1.02 + 2000 < now then
    redis.call('HDEL', KEYS[1], f)
  else
    out[#out + 1] = f
    out[#out + 1] = first
    out[#out + 1] = last
    out[#out + 1] = lim
    local left = last + math.ceil(p / 1000) * 1.02 + 2000 - now
    if left > keep then keep = left end
  end
end
if keep > 0 then redis.call('PEXPIRE', KEYS[1], math.ceil(keep)) end
return out
