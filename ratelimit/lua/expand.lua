-- expandScript (finalize.go), after codec.lua, layout.lua and ring.lua:
-- writes window record KEYS[1], if compact, back as a full ring (full),
-- keeping its expiry; n comes from its name (PERIOD:GRAN, as newRing
-- derives it). Reply: 1 if so.
if not byte then init() end
local k = _G.KEYS[1]
if redis.call('GETRANGE', k, '0', '0') ~= char(COMPACT) then return 0 end
local p, g = string.match(k, ':(%d+):(%d+)$')
if not p then return 0 end
local n = math.ceil(tonumber(p) / tonumber(g))
redis.call('SET', k, full(redis.call('GET', k), n), 'KEEPTTL')
return 1
