package ratelimit

import (
	"crypto/sha1"
	"encoding/hex"
)

// decideLua evaluates one request atomically on the Redis server: the same
// algorithm as keyState.decide (state.go), on packed strings, with the
// server's clock. It makes three calls (TIME, MGET, and one SET when state
// changes; two SETs when an admission and strikes happen together), and
// sets a TTL with every write so no key outlives its use.
//
// KEYS[1] window state, KEYS[2] strike and ban state (same hash slot).
//
// ARGV: mode (0 decide, 1 peek), extra strikes, layout, window count;
// per window: limit, period, gran, n, width, offset bytes, unit (µs); window-state TTL
// (ms); then the strike threshold (0: no bans) followed, when positive, by
// strike period, gran, n, unit, strike layout, offence memory, the number
// of ban lengths and the lengths (µs).
//
// Window state: layout (8 bytes), then per window: head (6), total
// (width), and n+1 slots of count (width) + last-event offset (3 or 0).
// Ban state: ban end (7), offences (2), last offence (7), strike layout
// (8), strike head (6), strike total (4), sn+1 slots of count (4) + offset (3).
//
// Reply: outcome, retry, now, new ban, strikes, ban end, offences, then per
// window used, remaining, reset. All integers, times in µs.
const decideLua = `
local byte, char, sub, rep, floor, ceil = string.byte, string.char, string.sub, string.rep, math.floor, math.ceil

local function get(s, p, k)
  local v = 0
  for i = p, p + k - 1 do v = v * 256 + byte(s, i) end
  return v
end

local function enc(v, k)
  local t = {}
  for i = k, 1, -1 do
    local r = v % 256
    t[i] = r
    v = (v - r) / 256
  end
  return char(unpack(t))
end

local function put(s, p, x)
  return sub(s, 1, p - 1) .. x .. sub(s, p + #x)
end

local function ring(s, P, limit, period, gran, n, width, ob, unit)
  local r = {P = P, R = P + 6 + width, limit = limit, period = period, gran = gran, n = n,
    w = width, ob = ob, unit = unit, sz = width + ob, size = n + 1, cap = 256 ^ width - 1}
  r.head = get(s, P, 6)
  r.total = get(s, P + 6, width)
  return r
end

local function slot(r, j) return r.R + (j % r.size) * r.sz end

local function bucket(r, now)
  local b = floor(now / r.gran)
  if b < r.head then b = r.head end
  return b
end

local function advance(s, r, b)
  if b <= r.head then return s end
  if r.total > 0 then
    if b - r.head > r.n then
      s = sub(s, 1, r.R - 1) .. rep('\0', r.size * r.sz) .. sub(s, r.R + r.size * r.sz)
      r.total = 0
    else
      local zero = rep('\0', r.w)
      for j = r.head - r.n, b - r.n - 1 do
        local p = slot(r, j)
        local c = get(s, p, r.w)
        if c > 0 then
          r.total = r.total - c
          if r.total < 0 then r.total = 0 end
          s = put(s, p, zero)
        end
      end
    end
  end
  r.head = b
  return s
end

local function last(s, r, j, p)
  if r.ob == 0 then return (j + 1) * r.gran end
  return j * r.gran + get(s, p + r.w, 3) * r.unit
end

local function untl(r, j, l)
  local t = l + r.period
  local lo, hi = (j + r.n) * r.gran, (j + r.n + 1) * r.gran
  if t < lo then t = lo end
  if t > hi then t = hi end
  return t
end

local function used(s, r, now, b)
  local j0 = b - r.n
  local p = slot(r, j0)
  local c0 = get(s, p, r.w)
  if c0 > 0 and last(s, r, j0, p) + r.period <= now then return r.total - c0, j0 + 1 end
  return r.total, j0
end

local function retry(s, r, from, b, excess)
  local acc = 0
  for j = from, b do
    local p = slot(r, j)
    local c = get(s, p, r.w)
    if c > 0 then
      acc = acc + c
      if acc >= excess then return untl(r, j, last(s, r, j, p)) end
    end
  end
  return 0
end

local function reset(s, r, from, b, u, now)
  if u <= 0 then return now end
  for j = b, from, -1 do
    local p = slot(r, j)
    if get(s, p, r.w) > 0 then return untl(r, j, last(s, r, j, p)) end
  end
  return now
end

local function add(s, r, b, now, k)
  local p = slot(r, b)
  local c = get(s, p, r.w) + k
  if c > r.cap then c = r.cap end
  if r.ob > 0 then
    local o = now - b * r.gran
    if o < 0 then o = 0 end
    s = put(s, p, enc(c, r.w) .. enc(ceil(o / r.unit), 3))
  else
    s = put(s, p, enc(c, r.w))
  end
  r.total = r.total + k
  if r.total > r.cap then r.total = r.cap end
  return put(s, r.P, enc(r.head, 6) .. enc(r.total, r.w))
end

local mode, extra, layout, nw = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local peek = mode == 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local st = redis.call('MGET', KEYS[1], KEYS[2])
local ws, bs = st[1], st[2]

local a, pos = 5, 9
local spec = {}
for i = 1, nw do
  local width, n, ob = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 5])
  spec[i] = {pos, a}
  pos = pos + 6 + width + (n + 1) * (width + ob)
  a = a + 7
end
if not ws or #ws ~= pos - 1 or sub(ws, 1, 8) ~= layout then
  ws = layout .. rep('\0', pos - 9)
end
local stateMS = tonumber(ARGV[a])
local thr = tonumber(ARGV[a + 1])
local ban = thr > 0

local rs, bks, frs, us = {}, {}, {}, {}
local admit = true
local banUntil, offences, offenceAt, sr = 0, 0, 0, nil
if ban then
  local sp, sg, sn, su, sl = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), ARGV[a + 6]
  local blen = 34 + (sn + 1) * 7
  if not bs or #bs ~= blen then
    bs = rep('\0', 16) .. sl .. rep('\0', blen - 24)
  elseif sub(bs, 17, 24) ~= sl then
    bs = sub(bs, 1, 16) .. sl .. rep('\0', blen - 24)
  end
  banUntil, offences, offenceAt = get(bs, 1, 7), get(bs, 8, 2), get(bs, 10, 7)
  sr = ring(bs, 25, thr, sp, sg, sn, 4, 3, su)
  if offences > 0 and offenceAt + tonumber(ARGV[a + 7]) <= now then offences = 0 end
end
local banned = ban and banUntil > now
if banned then admit = false end

for i = 1, nw do
  local x = spec[i][2]
  local r = ring(ws, spec[i][1], tonumber(ARGV[x]), tonumber(ARGV[x + 1]), tonumber(ARGV[x + 2]),
    tonumber(ARGV[x + 3]), tonumber(ARGV[x + 4]), tonumber(ARGV[x + 5]), tonumber(ARGV[x + 6]))
  local b = bucket(r, now)
  ws = advance(ws, r, b)
  local c, from = used(ws, r, now, b)
  rs[i], bks[i], frs[i], us[i] = r, b, from, c
  if c >= r.limit then admit = false end
end
if admit and not peek then
  for i = 1, nw do ws = add(ws, rs[i], bks[i], now, 1) end
  redis.call('SET', KEYS[1], ws, 'PX', stateMS)
end

local newBan, strikes = 0, 0
if ban then
  local b = bucket(sr, now)
  bs = advance(bs, sr, b)
  local k = extra
  if not admit and not banned then k = k + 1 end
  if not peek and not banned and k > 0 then
    bs = add(bs, sr, b, now, k)
    local c = used(bs, sr, now, b)
    if c > thr then
      local nd = tonumber(ARGV[a + 8])
      offences = offences + 1
      if offences > 65535 then offences = 65535 end
      offenceAt = now
      local idx = offences
      if idx > nd then idx = nd end
      banUntil = now + tonumber(ARGV[a + 8 + idx])
      sr.total = 0
      bs = sub(bs, 1, 30) .. rep('\0', 4 + (sr.size) * 7)
      banned, newBan = true, 1
    end
    bs = enc(banUntil, 7) .. enc(offences, 2) .. enc(offenceAt, 7) .. sub(bs, 17)
    local e = banUntil
    if offenceAt + tonumber(ARGV[a + 7]) > e then e = offenceAt + tonumber(ARGV[a + 7]) end
    if (b + sr.n + 1) * sr.gran > e then e = (b + sr.n + 1) * sr.gran end
    redis.call('SET', KEYS[2], bs, 'PX', ceil((e - now) / 1000) + 1)
  end
  strikes = used(bs, sr, now, b)
  if banUntil <= now then banUntil = 0 end
end

local admitted = admit and not peek
local out, rt = 0, 0
local res = {0, 0, now, newBan, strikes, banUntil, offences}
for i = 1, nw do
  local r, u = rs[i], us[i]
  if admitted then u = u + 1 end
  local rem = r.limit - u
  if rem < 0 then rem = 0 end
  res[#res + 1] = u
  res[#res + 1] = rem
  res[#res + 1] = reset(ws, r, frs[i], bks[i], u, now)
  if not admit and u >= r.limit then
    local x = retry(ws, r, frs[i], bks[i], u - r.limit + 1) - now
    if x > rt then rt = x end
  end
end
if banned then
  out, rt = 2, banUntil - now
elseif not admit then
  out = 1
else
  rt = 0
end
res[1], res[2] = out, rt
return res
`

// script is decideLua with its SHA1 for EVALSHA.
type script struct {
	src string
	sha string
}

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	return script{src: src, sha: hex.EncodeToString(sum[:])}
}
