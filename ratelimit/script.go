package ratelimit

import (
	"crypto/sha1"
	"encoding/hex"
)

// decideLua evaluates one request atomically on the Redis server: the same
// algorithm as keyState.decide (state.go), on packed strings, with the
// server's clock. It reads the window state in parts (GETRANGE): the
// layout and headers, then only the slots the decision needs (usually
// none, or the one that leaves a window as its head moves), and the whole
// string only to scan it for a rejection or a peek; the ban state only
// when the window state flags it. An admission writes only the bytes that
// change (rebuilding a 1 KB string costs several times more in Lua), and
// refreshes the TTL when the longest window moves to a new bucket; strikes
// rewrite the small ban string with its TTL. No key is ever left without
// a TTL.
//
// KEYS[1] window state, KEYS[2] strike and ban state (same hash slot).
//
// ARGV: the per-call numbers packed (see below): mode (0 decide, 1 peek),
// extra strikes, lease size wanted, lease room needed, lease life (µs);
// then the plan's: window layout, the format and packed string of its
// numbers, the format of the window headers, strike layout, ban
// multiplier, the reply's format, the format and packed string of the
// ban's numbers. The plan's numbers: window count, state size,
// window-state TTL (ms), strike threshold (0: no bans); per window 9:
// limit, period (µs), ring geometry as newRing computes it (gran, n,
// count width, offset bytes, offset unit), header and ring positions.
// The ban's: strike period, gran, n and offset unit, offence memory, ban
// base and max (µs). Numbers come packed, 8 bytes each, because tonumber
// costs Redis about 0.1 µs per argument; the geometry comes precomputed
// because deriving it costs as much again; and the ban's numbers are
// decoded only for keys with ban state.
//
// Window state: layout (8 bytes), ban flag (1: 1 when the ban state may
// exist; set whenever the script writes the ban state while the window
// state exists, and written with the window state when it is created),
// every window's header: head (6), total
// (width), the head bucket's count (width) and last-event offset (3 or 0);
// then every window's n+1 slots of count and offset for older buckets. An
// admission in the head bucket writes only the headers (one SETRANGE for
// all windows); slots are written when the head moves. Slots of buckets
// newer than the stored head are stale and read as empty; they are zeroed
// when the head passes them.
// Ban state: ban end (7), offences (2), last offence (7), strike layout
// (8), strike ring header (6+4+4+3), sn+1 slots of count (4) + offset (3).
//
// Leases: an admission counts want admissions at once (a lease) when every
// window has at least need (>= want) remaining; they count in the current
// bucket of every window and may be spent until the lease ends: the end of
// the current bucket of every window, and at most life after now. Where a
// bucket keeps its last admission's time, the lease's end is recorded, and
// that time only ever grows. Otherwise one admission counts, as always.
//
// Reply: one string of 8-byte big-endian signed integers (decode reads it):
// outcome, retry, now, new ban, strikes, ban end, offences, admissions
// granted, lease end, then per window used, remaining, reset. Times in µs.
const decideLua = `
local byte, char, sub, rep, floor, ceil = string.byte, string.char, string.sub, string.rep, math.floor, math.ceil
` + codecLua + `

-- get reads a k-byte big-endian integer at position p of s.
local function get(s, p, k)
  if k == 1 then return byte(s, p) end
  if k == 2 then
    local a, b = byte(s, p, p + 1)
    return a * 256 + b
  end
  if k == 3 then
    local a, b, c = byte(s, p, p + 2)
    return (a * 256 + b) * 256 + c
  end
  if k == 6 then
    local a, b, c, d, e, f = byte(s, p, p + 5)
    return ((a * 256 + b) * 256 + c) * 16777216 + (d * 256 + e) * 256 + f
  end
  local v = 0
  for i = p, p + k - 1 do v = v * 256 + byte(s, i) end
  return v
end

-- enc writes v as a k-byte big-endian integer.
local function enc(v, k)
  if k == 1 then return char(v) end
  if k == 2 then return char(floor(v / 256), v % 256) end
  if k == 3 then return char(floor(v / 65536), floor(v / 256) % 256, v % 256) end
  local hi = floor(v / 16777216)
  local lo = v - hi * 16777216
  if k == 6 then
    return char(floor(hi / 65536), floor(hi / 256) % 256, hi % 256, floor(lo / 65536), floor(lo / 256) % 256, lo % 256)
  end
  return enc(hi, k - 3) .. enc(lo, 3)
end

-- A ring covers the buckets head-n .. head. Its header holds the head
-- bucket, the total, and the head bucket's count and last-event offset
-- (hc, ho); the n+1 slots after it hold the older buckets, slot j%(n+1)
-- for bucket j, each a w-byte count and, when ob > 0, the 3-byte offset
-- (in units) of the bucket's last event. A slot is written when the head
-- moves past its bucket; slots of buckets after the stored head vh are
-- stale and read as empty.

local function cnt(s, R, n, sz, w, vh, hc, j)
  if j > vh then return 0 end
  if j == vh then return hc end
  return get(s, R + (j % (n + 1)) * sz, w)
end

local function lastAt(s, R, n, sz, w, ob, g, unit, vh, ho, j)
  if ob == 0 then return (j + 1) * g end
  if j == vh then return j * g + ho * unit end
  return j * g + get(s, R + (j % (n + 1)) * sz + w, 3) * unit
end

-- untl is when bucket j (last event at l) stops counting.
local function untl(j, l, period, n, g)
  local t = l + period
  local lo, hi = (j + n) * g, (j + n + 1) * g
  if t < lo then t = lo end
  if t > hi then t = hi end
  return t
end

-- advanced returns the total once the head moves from vh to b.
local function advanced(s, R, n, sz, w, vh, total, b)
  if b <= vh or total <= 0 then return total end
  if b - vh > n then return 0 end
  for j = vh - n, b - n - 1 do total = total - get(s, R + (j % (n + 1)) * sz, w) end
  if total < 0 then total = 0 end
  return total
end

-- used returns the events counted at now (head b) and the first bucket
-- that counts: the oldest bucket leaves as soon as its last event is a
-- full period old.
local function used(s, R, n, sz, w, ob, g, unit, period, vh, hc, ho, total, now, b)
  local j0 = b - n
  -- Without offsets, a bucket's last event counts as its end, and when
  -- the period is n whole buckets that is always later than now less the
  -- period: the oldest bucket is never dropped early, and its slot need
  -- not be read.
  if ob == 0 and period == n * g then return total, j0 end
  local c0 = cnt(s, R, n, sz, w, vh, hc, j0)
  if c0 > 0 and lastAt(s, R, n, sz, w, ob, g, unit, vh, ho, j0) + period <= now then return total - c0, j0 + 1 end
  return total, j0
end

-- move returns (position, bytes) for the slot writes needed when the head
-- moves from vh to b: the old head bucket's count (when it stays in the
-- ring) and zeros over the stale slots of the buckets skipped. These
-- slots are consecutive, so this is one write (two when the ring wraps).
local function move(n, sz, w, ob, R, vh, hc, ho, b)
  local lo, x = b - n, ''
  if vh >= lo then
    lo = vh
    x = enc(hc, w)
    if ob > 0 then x = x .. enc(ho, 3) end
  end
  local k = b - lo
  if k <= 0 then return end
  x = x .. rep('\0', k * sz - #x)
  local i = lo % (n + 1)
  if i + k <= n + 1 then return R + i * sz, x end
  local first = (n + 1 - i) * sz
  return R + i * sz, sub(x, 1, first), R, sub(x, first + 1)
end

local mode, extra, want, need, life = unpack_('>I8I8I8I8I8', ARGV[1], 1)
local layout, hfmt = ARGV[2], ARGV[5]
local peek = mode == 1
-- V: the plan's numbers (see ARGV above); per window 9 from 5: limit,
-- period, gran, n, width, offset bytes, unit, header position, ring
-- position.
local V = {unpack_(ARGV[3], ARGV[4], 1)}
local nw, size, stateMS, thr = V[1], V[2], V[3], V[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- The window state is read in parts: the layout and headers first, then
-- for each window only the slots the decision needs (most often none, or
-- the one slot that leaves when the head moves), and the whole string
-- only to scan it for a rejection or a peek. Reading the whole string
-- costs Redis more than all of the arithmetic.
local hl = V[13] - 1
local ws = redis.call('GETRANGE', KEYS[1], 0, hl - 1)
local fresh = #ws ~= hl or sub(ws, 1, 8) ~= layout
-- The ban state is read only when the window state's flag (byte 9)
-- says it may exist, or there is no window state to say.
local bs = false
if thr > 0 and (fresh or byte(ws, 9) == 1) then bs = redis.call('GET', KEYS[2]) end
local full = fresh
if fresh then
  local flag = '\0'
  if bs then flag = '\1' end
  ws = layout .. flag .. rep('\0', size - 9)
end
local H = {unpack_(hfmt, ws, V[12])}
-- X: per window 8 working values: stored head, total, head, first
-- counted bucket, used, head count, head offset, new head offset.
local X = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local ban = thr > 0

-- Ban state: ban end (7), offences (2), last offence (7), strike layout
-- (8), strike ring header (17), strike slots.
local banUntil, offences, offenceAt = 0, 0, 0
local sg, sn, su, sp, sl, memory, banBase, banMax
if ban then
  sl = ARGV[6]
  if bs then
    sp, sg, sn, su, memory, banBase, banMax = unpack_(ARGV[9], ARGV[10], 1)
    if #bs ~= 41 + (sn + 1) * 7 then
      bs = false
    elseif sub(bs, 17, 24) ~= sl then
      bs = sub(bs, 1, 16) .. sl .. rep('\0', 17 + (sn + 1) * 7)
    end
  end
  if bs then
    banUntil, offences, offenceAt = get(bs, 1, 7), get(bs, 8, 2), get(bs, 10, 7)
    if offences > 0 and offenceAt + memory <= now then offences = 0 end
  end
end
local banned = ban and banUntil > now
local admit = not banned
local room, lend = -1, now + life

local k = 1
for i = 1, nw do
  local o, q = 4 + 9 * (i - 1), 8 * (i - 1)
  local g, n, w, ob = V[o + 3], V[o + 4], V[o + 5], V[o + 6]
  local vh, total, hc, ho = H[k], H[k + 1], H[k + 2], 0
  if ob > 0 then
    ho = H[k + 3]
    k = k + 4
  else
    k = k + 3
  end
  local b = floor(now / g)
  if b < vh then b = vh end
  local s, R, sz = ws, V[o + 9], w + ob
  if not full then
    -- The buckets whose slots advanced and used read: those leaving
    -- the ring as the head moves, and the oldest still in it.
    local lo, hi
    if ob == 0 and V[o + 2] == n * g then
      if b > vh and b - vh <= n and total > 0 then lo, hi = vh - n, b - n - 1 end
    elseif b - vh <= n then
      lo, hi = b - n, b - n
      if b > vh then lo = vh - n end
    end
    if lo then
      local i, k = lo % (n + 1), hi - lo + 1
      if i + k > n + 1 then i, k = 0, n + 1 end
      s = redis.call('GETRANGE', KEYS[1], R - 1 + i * sz, R - 2 + (i + k) * sz)
      R = 1 - i * sz
    end
  end
  total = advanced(s, R, n, sz, w, vh, total, b)
  local c, from = used(s, R, n, sz, w, ob, g, V[o + 7], V[o + 2], vh, hc, ho, total, now, b)
  X[q + 1], X[q + 2], X[q + 3], X[q + 4], X[q + 5], X[q + 6], X[q + 7] = vh, total, b, from, c, hc, ho
  if c >= V[o + 1] then admit = false end
  if room < 0 or V[o + 1] - c < room then room = V[o + 1] - c end
  if (b + 1) * g < lend then lend = (b + 1) * g end
end

-- A rejection or a peek scans the windows: read them whole.
if not full and not (admit and not peek) then ws = redis.call('GET', KEYS[1]) end

-- granted admissions count at once; at is the time recorded for them.
local granted, at = 1, now
if want > 1 and room >= need and room >= want then granted, at = want, lend else lend = 0 end

if admit and not peek then
  local key = KEYS[1]
  local hdr, h = {0, 0, 0, 0, 0, 0, 0, 0}, 0
  local refresh = fresh
  for i = 1, nw do
    local o, q = 4 + 9 * (i - 1), 8 * (i - 1)
    local g, n, w, ob, vh, b, hc = V[o + 3], V[o + 4], V[o + 5], V[o + 6], X[q + 1], X[q + 3], X[q + 6]
    if b > vh then
      if not fresh then
        local p1, x1, p2, x2 = move(n, w + ob, w, ob, V[o + 9], vh, hc, X[q + 7], b)
        if p1 then redis.call('SETRANGE', key, p1 - 1, x1) end
        if p2 then redis.call('SETRANGE', key, p2 - 1, x2) end
      end
      hc = 0
      -- The longest window (last) keeps the TTL: refreshed when its
      -- bucket changes, to its period plus two buckets.
      if i == nw then refresh = true end
    end
    hdr[h + 1], hdr[h + 2], hdr[h + 3] = b, X[q + 2] + granted, hc + granted
    h = h + 3
    if ob > 0 then
      local off = at - b * g
      if off < 0 then off = 0 end
      off = ceil(off / V[o + 7])
      if hc > 0 and X[q + 7] > off then off = X[q + 7] end
      X[q + 8] = off
      h = h + 1
      hdr[h] = off
    end
  end
  if fresh then
    ws = sub(ws, 1, V[12] - 1) .. pack_(hfmt, unpack(hdr, 1, h)) .. sub(ws, V[13])
    redis.call('SET', key, ws, 'PX', stateMS)
  else
    redis.call('SETRANGE', key, V[12] - 1, pack_(hfmt, unpack(hdr, 1, h)))
    if refresh then redis.call('PEXPIRE', key, stateMS) end
  end
end

local newBan, strikes = 0, 0
k = extra
if not admit and not banned then k = k + 1 end
if ban and not bs and not peek and k > 0 then
  sp, sg, sn, su, memory, banBase, banMax = unpack_(ARGV[9], ARGV[10], 1)
  bs = rep('\0', 16) .. sl .. rep('\0', 17 + (sn + 1) * 7) end
if ban and bs then
  local R, sz = 42, 7
  local vh, total, hc, ho = get(bs, 25, 6), get(bs, 31, 4), get(bs, 35, 4), get(bs, 39, 3)
  local b = floor(now / sg)
  if b < vh then b = vh end
  total = advanced(bs, R, sn, sz, 4, vh, total, b)
  if not peek and not banned and k > 0 then
    if b > vh then
      local p1, x1, p2, x2 = move(sn, sz, 4, 3, R, vh, hc, ho, b)
      if p1 then bs = sub(bs, 1, p1 - 1) .. x1 .. sub(bs, p1 + #x1) end
      if p2 then bs = sub(bs, 1, p2 - 1) .. x2 .. sub(bs, p2 + #x2) end
      hc = 0
    end
    hc = hc + k
    if hc > 4294967295 then hc = 4294967295 end
    total = total + k
    if total > 4294967295 then total = 4294967295 end
    local off = now - b * sg
    if off < 0 then off = 0 end
    ho, vh = ceil(off / su), b
    if used(bs, R, sn, sz, 4, 3, sg, su, sp, vh, hc, ho, total, now, b) > thr then
      offences = offences + 1
      if offences > 65535 then offences = 65535 end
      offenceAt = now
      -- banLength is plan.banLength: base*mult^(off-1), capped.
      local function banLength(off, base, mult, max)
        local d, limit = base, 2 ^ 50
        if max > 0 then limit = max end
        local i = 1
        while i < off and d < limit and mult > 1 do
          d = d * mult
          i = i + 1
        end
        if d > limit then d = limit end
        d = floor(d)
        if d < 1 then d = 1 end
        return d
      end
      banUntil = now + banLength(offences, banBase, tonumber(ARGV[7]), banMax)
      total, hc, ho = 0, 0, 0
      bs = sub(bs, 1, 41) .. rep('\0', (sn + 1) * sz)
      banned, newBan = true, 1
    end
    bs = enc(banUntil, 7) .. enc(offences, 2) .. enc(offenceAt, 7) .. sl .. enc(b, 6) .. enc(total, 4) .. enc(hc, 4) .. enc(ho, 3) .. sub(bs, 42)
    local e = banUntil
    if offenceAt + memory > e then e = offenceAt + memory end
    if (b + sn + 1) * sg > e then e = (b + sn + 1) * sg end
    redis.call('SET', KEYS[2], bs, 'PX', ceil((e - now) / 1000) + 1)
    -- Flag the ban state in the window state, where it exists.
    if byte(ws, 9) ~= 1 and (not fresh or (admit and not peek)) then redis.call('SETRANGE', KEYS[1], 8, '\1') end
  end
  strikes = used(bs, R, sn, sz, 4, 3, sg, su, sp, vh, hc, ho, total, now, b)
  if banUntil <= now then banUntil = 0 end
end

local admitted = admit and not peek
if not admitted then granted, lend = 0, 0 end
local rt = 0
-- scan is needed only for a rejection or a peek (and not built otherwise).
local scan
if not admitted then
  -- scan returns, walking from bucket from to b, when enough buckets have
  -- stopped counting to drop excess of the u events counted (retry), or,
  -- with excess 0, when the newest counted bucket stops counting (reset).
  -- Once the older buckets' counts are all seen it jumps to the head.
  scan = function(s, R, n, sz, w, ob, g, unit, period, vh, hc, ho, from, b, excess, u, now)
    if excess > 0 then
      local acc, older, j = 0, u - hc, from
      while j <= b do
        if j < vh and acc >= older then j = vh end
        local c = cnt(s, R, n, sz, w, vh, hc, j)
        if c > 0 then
          acc = acc + c
          if acc >= excess then return untl(j, lastAt(s, R, n, sz, w, ob, g, unit, vh, ho, j), period, n, g) end
        end
        j = j + 1
      end
      return now
    end
    for j = b, from, -1 do
      if cnt(s, R, n, sz, w, vh, hc, j) > 0 then return untl(j, lastAt(s, R, n, sz, w, ob, g, unit, vh, ho, j), period, n, g) end
    end
    return now
  end
end
local res = {0, 0, now, newBan, strikes, banUntil, offences, granted, lend, 0, 0, 0, 0, 0, 0}
for i = 1, nw do
  local o, q = 4 + 9 * (i - 1), 8 * (i - 1)
  local limit, period, g, n, w, ob, unit = V[o + 1], V[o + 2], V[o + 3], V[o + 4], V[o + 5], V[o + 6], V[o + 7]
  local vh, b, from, u = X[q + 1], X[q + 3], X[q + 4], X[q + 5]
  local reset_
  if admitted then
    u = u + granted
    local l = (b + 1) * g
    if ob > 0 then l = b * g + X[q + 8] * unit end
    reset_ = untl(b, l, period, n, g)
  else
    reset_ = scan(ws, V[o + 9], n, w + ob, w, ob, g, unit, period, vh, X[q + 6], X[q + 7], from, b, 0, u, now)
  end
  local rem = limit - u
  if rem < 0 then rem = 0 end
  res[10 + 3 * (i - 1)], res[11 + 3 * (i - 1)], res[12 + 3 * (i - 1)] = u, rem, reset_
  if not admit and u >= limit then
    local x = scan(ws, V[o + 9], n, w + ob, w, ob, g, unit, period, vh, X[q + 6], X[q + 7], from, b, u - limit + 1, u, now) - now
    if x > rt then rt = x end
  end
end
if banned then
  res[1], res[2] = 2, banUntil - now
elseif not admit then
  res[1], res[2] = 1, rt
end
return pack_(ARGV[8], unpack(res, 1, 9 + 3 * nw))
`

// codecLua binds unpack_ and pack_: big-endian unsigned integers of the
// given byte widths (">I6I2I3"), read from string s at position p (the
// values, then the position after them) or packed into one string. Redis
// has them in C (the struct library, several times faster than decoding
// byte by byte in Lua); elsewhere (miniredis in tests) the same functions
// are written in Lua, for the formats used here: '>' then 'I' with a
// width of 1 to 8. TestCodecMatchesStruct checks that they agree.
const codecLua = `
local unpack_, pack_
local lib = rawget(_G, 'struct')
if lib then
  unpack_, pack_ = lib.unpack, lib.pack
else
  unpack_ = function(f, s, p)
    local out, m = {}, 0
    for d in string.gmatch(f, '[Ii](%d)') do
      local v, w = 0, tonumber(d)
      for i = p, p + w - 1 do v = v * 256 + byte(s, i) end
      m = m + 1
      out[m] = v
      p = p + w
    end
    out[m + 1] = p
    return unpack(out, 1, m + 1)
  end
  pack_ = function(f, ...)
    local args, out, m = {...}, {}, 0
    for d in string.gmatch(f, '[Ii](%d)') do
      m = m + 1
      local v, x = args[m], ''
      for _ = 1, tonumber(d) do
        x = char(v % 256) .. x
        v = floor(v / 256)
      end
      out[m] = x
    end
    return table.concat(out)
  end
end
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
