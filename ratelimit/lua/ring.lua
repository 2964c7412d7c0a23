-- The decision code (script.go), first of its files: the locals every
-- decision shares, bound on the first call, the record layout (format.go)
-- and what reads, moves and writes a ring of buckets.

-- Everything a decision uses is a local of this chunk (globals are table
-- lookups), bound by init on the first call: a Function library's code
-- runs at load time without Redis's standard libraries. KEYS and ARGV are
-- the call's, set by run.
local byte, char, sub, rep, floor, ceil, format
local unpack, pcall, type, tostring, tonumber
local unpack_, pack_
local call, KEYS, ARGV, now
-- FIN is when the operator finalized this release's records (µs, 0: not
-- finalized, or not in force on the calling replica): ARGV[2] (expiry
-- below).
local FIN
-- NOWMS is now in whole ms: expiries are set relative to it (expiry).
local NOWMS
-- Offsets passed to redis.call, as strings: OFF[v] is v's (its table's
-- __index makes it on first use). A batch's decisions at one instant
-- mostly read and write the same slots of their windows, so each offset
-- is formatted once (per call of the script; once for all with a
-- Function, whose library lives on between calls), and found by one table
-- read.
local OFF
local function init()
  byte, char, sub, rep, format = string.byte, string.char, string.sub, string.rep, string.format
  floor, ceil = math.floor, math.ceil
  unpack, pcall, type, tostring, tonumber = _G.unpack, _G.pcall, _G.type, _G.tostring, _G.tonumber
  call = redis.call
  OFF = setmetatable({}, {__index = function(t, v)
    local o = format('%d', v)
    t[v] = o
    return o
  end})
  unpack_, pack_ = codec()
end
-- Record layout (format.go): a ring is a header of head (8), total (4),
-- head count (4) and head offset (2) bytes, then n+1 slots of count (4)
-- and offset (2). A window record is a version byte and a ring; a ban
-- record is version, ban end, offences, last offence, strike period and
-- strike bucket width (1+8+4+8+8+8 bytes), then the strike ring.
local VERSION, HDR, SLOT, MAXC = 1, 18, 6, 4294967295
local RINGFMT = '>I8I4I4I2'
-- An empty slot.
local EMPTY = '\0\0\0\0\0\0'
-- A window record's slots start here (1-based).
local WR = 2 + HDR

-- get reads a k-byte big-endian integer at position p of s.
local WIDTH = {'>I1', '>I2', '>I3', '>I4', '>I5', '>I6', '>I7', '>I8'}
local function get(s, p, k)
  return (unpack_(WIDTH[k], s, p))
end

-- A view of a ring's slots: slot i of the ring is at position R + i*SLOT
-- of s. Slots of buckets after the head vh are stale and read as empty;
-- the head's own count and offset (hc, ho) are in the header.
local function cnt(s, R, n, vh, hc, j)
  if j > vh then return 0 end
  if j == vh then return hc end
  return get(s, R + (j % (n + 1)) * SLOT, 4)
end

local function lastAt(s, R, n, g, unit, vh, ho, j)
  if j == vh then return j * g + ho * unit end
  return j * g + get(s, R + (j % (n + 1)) * SLOT + 4, 2) * unit
end

-- Strings of zeros by length, made once: comparing a run of slots with
-- one tells an empty run without decoding it, and writing one clears a
-- run without building it. (A Function keeps them between calls; Lua
-- interns strings, so an equal string read from Redis is the same string,
-- and compares in one step.) Lengths are whole slots; at most 256 are
-- kept.
local ZEROS, nzeros = {}, 0
local function zeros(k)
  local z = ZEROS[k]
  if not z then
    if nzeros >= 256 then ZEROS, nzeros = {}, 0 end
    z = rep(EMPTY, k / SLOT)
    ZEROS[k], nzeros = z, nzeros + 1
  end
  return z
end

-- Numbers passed to redis.call go as decimal strings: Lua would format
-- them as floats ("%.14g"), several times dearer.
local function itoa(v) return format('%d', v) end

-- EXPX and EXPS are the last expiry set (ms from NOWMS) and its text: a
-- call's decisions mostly set the same one (their records' epochs, for a
-- plan's shortest window, end together), formatted once.
local EXPX, EXPS = -1, ''

-- A window record's expiry. Its buckets are grouped in epochs of n/4
-- (one at least: about a quarter of its period). An event of an epoch is
-- recorded at most a bucket after the epoch ends (a lease's end, rounded
-- up to an offset unit) and stops counting a period after that; the
-- record TTL (ttl, ms) is a period, two buckets and a millisecond, so
-- expiry(b, g, n, ttl), the end of head bucket b's epoch plus ttl (ms
-- since the Unix epoch), keeps the record for every event of the epoch.
-- It is never earlier than ttl from now (now lies in the epoch), which is
-- what releases before this one refresh the record to on every head
-- move, and every writer of this release sets the same one for an epoch:
-- none shortens what an older release's writer or another of its own
-- would have set at that moment.
-- Before FIN (not finalized) every write that moves the head sets it, as
-- those releases refresh theirs; once finalized only a move into a new
-- epoch does, or one within an epoch that began before FIN (its first
-- write may have been an older release's). A new record (SET) and a
-- seeded one are written with it. (A product below 2^53 divided by 1000
-- is exact or at least 10^-3 from an integer, more than the quotient's
-- rounding error, so ceil gives the exact ms.) It is set relative to
-- NOWMS (PEXPIRE, SET PX), as releases before this one set theirs, never
-- as a time (PEXPIREAT): a long call's later decisions run after Redis's
-- clock has moved on from now, and a time that clock has passed would
-- delete the record at once, and with it what the call's earlier
-- decisions counted there. Relative to the clock Redis sets it by (the
-- call's start, at most now), it is at most a millisecond earlier than
-- the time, which the TTL's millisecond covers.
local function expiry(b, g, n, ttl)
  local E = (n - n % 4) / 4
  if E < 1 then E = 1 end
  return ceil((b - b % E + E) * g / 1000) + ttl
end

-- Empty window records by slot count, made once, as zeros are: a new
-- record is written as one of these and then its header, so that no new
-- record's 1.2 KB is built, and hashed, in Lua. At most 256 are kept.
local BLANK, nblank = {}, 0
local function blank(n)
  local z = BLANK[n]
  if not z then
    if nblank >= 256 then BLANK, nblank = {}, 0 end
    z = char(VERSION) .. rep('\0', HDR) .. rep(EMPTY, n + 1)
    BLANK[n], nblank = z, nblank + 1
  end
  return z
end

-- counts returns the sum of the counts of slots i0 .. i1 (i0 <= i1) of a
-- ring whose slot 0 is at position R of s. Runs of 8 slots that are all
-- zero (most of a cold key's) are skipped whole; the others are decoded
-- slot by slot.
local RUN = 8 * SLOT
local function counts(s, R, i0, i1)
  local sum, p, last = 0, R + i0 * SLOT, R + (i1 + 1) * SLOT
  if last - p <= 2 * SLOT then
    for q = p, last - 1, SLOT do sum = sum + unpack_('>I4', s, q) end
    return sum
  end
  while p < last do
    local q = p + RUN
    if q > last then q = last end
    if sub(s, p, q - 1) ~= zeros(q - p) then
      for r = p, q - 1, SLOT do sum = sum + unpack_('>I4', s, r) end
    end
    p = q
  end
  return sum
end

-- untl is when bucket j (last event at l) stops counting. Until it is
-- the oldest a ring holds ((j + n) g) it counts whatever its last event,
-- unless the head (vh, when given) is already n past it: a coarse
-- record's may lie a bucket ahead of now (blockWrite).
local function untl(j, l, period, n, g, vh)
  local t = l + period
  local lo, hi = (j + n) * g, (j + n + 1) * g
  if t < lo and not (vh and vh >= j + n) then t = lo end
  if t > hi then t = hi end
  return t
end

-- advanced returns the total once the head moves from vh to b: the
-- buckets vh-n .. b-n-1 leave, at most n slots, in one run of the ring or
-- two when it wraps. A window's (view) and a strike ring's (strike).
local function advanced(s, R, n, vh, total, b)
  if b <= vh or total <= 0 then return total end
  if b - vh > n then return 0 end
  local i0, i1 = (vh - n) % (n + 1), (b - n - 1) % (n + 1)
  if i0 <= i1 then
    total = total - counts(s, R, i0, i1)
  else
    total = total - counts(s, R, i0, n) - counts(s, R, 0, i1)
  end
  if total < 0 then total = 0 end
  return total
end

-- used returns the events counted at now (head b) and the first bucket
-- that counts: the oldest bucket leaves as soon as its last event is a
-- full period old.
local function used(s, R, n, g, unit, period, vh, hc, ho, total, now, b)
  local j0 = b - n
  local c0 = cnt(s, R, n, vh, hc, j0)
  if c0 > 0 and lastAt(s, R, n, g, unit, vh, ho, j0) + period <= now then return total - c0, j0 + 1 end
  return total, j0
end

-- move sets MV[1..2m] to the m (position, bytes) slot writes needed when
-- the head moves from vh to b, and returns m: the old head bucket's count
-- and offset (when it stays in the ring) and zeros over the stale slots
-- of the buckets skipped. These slots are consecutive: one write, two when
-- the ring wraps; a long run of zeros (a head that moved far) is written
-- apart from the old head's slot, from the zero strings above, so that
-- no long string is built. Positions are 1-based within the ring's slots.
local MV = {}
local function move(n, vh, hc, ho, b)
  local lo, x, m = b - n, '', 0
  if vh >= lo then
    lo = vh
    x = pack_('>I4I2', hc, ho)
  end
  local k = b - lo
  if k <= 0 then return 0 end
  if k > 8 and #x > 0 then
    MV[1], MV[2], m = 1 + (lo % (n + 1)) * SLOT, x, 1
    lo, k, x = lo + 1, k - 1, ''
  end
  local i, len = lo % (n + 1), k * SLOT
  -- The bytes from slot i to the ring's end.
  local first = (n + 1 - i) * SLOT
  local x1, x2
  if #x == 0 then
    if len > first then x1, x2 = zeros(first), zeros(len - first) else x1 = zeros(len) end
  else
    x = x .. zeros(len - #x)
    x1 = x
    -- (One at a time: miniredis's Lua assigns a list in turn.)
    if len > first then x1, x2 = sub(x, 1, first), sub(x, first + 1) end
  end
  MV[2 * m + 1], MV[2 * m + 2] = 1 + i * SLOT, x1
  if not x2 then return m + 1 end
  MV[2 * m + 3], MV[2 * m + 4] = 1, x2
  return m + 2
end

-- scan returns, walking from bucket from to b, when enough buckets have
-- stopped counting to drop excess events (retry) or, with excess 0, when
-- the newest counted bucket stops counting (reset).
local function scan(s, R, n, g, unit, period, vh, hc, ho, from, b, excess, now)
  if excess > 0 then
    local acc = 0
    for j = from, b do
      local c = cnt(s, R, n, vh, hc, j)
      if c > 0 then
        acc = acc + c
        if acc >= excess then return untl(j, lastAt(s, R, n, g, unit, vh, ho, j), period, n, g) end
      end
    end
    return now
  end
  for j = b, from, -1 do
    if cnt(s, R, n, vh, hc, j) > 0 then return untl(j, lastAt(s, R, n, g, unit, vh, ho, j), period, n, g) end
  end
  return now
end

-- carry adds to cs and os (counts and last offsets of a new record's
-- buckets, by age from its head b) every bucket of ss, a record of
-- geometry sg, sn, su, whose last event t still counts in a window of
-- period (g, n, unit) at now and lies in (lo, hi], whole, at t (or into
-- the oldest bucket kept, or the head when t lies past it), and returns
-- how many it carried.
local function carry(ss, sg, sn, su, period, g, n, unit, b, now, cs, os, lo, hi)
  local svh, stot, shc, sho = unpack_(RINGFMT, ss, 2)
  if stot <= 0 then return 0 end
  local total = 0
  for j = svh - sn, svh do
    local c = cnt(ss, WR, sn, svh, shc, j)
    if c > 0 then
      local t = lastAt(ss, WR, sn, sg, su, svh, sho, j)
      if t + period > now and t > lo and t <= hi then
        local bj = floor(t / g)
        if bj < b - n then bj = b - n end
        if bj > b then bj = b end
        local off = t - bj * g
        if off < 0 then off = 0 end
        off = ceil(off / unit)
        if off > 65535 then off = 65535 end
        -- Indexed by age (0 .. n), small keys.
        local a = b - bj
        if not cs[a] then
          cs[a], os[a] = 0, off
        elseif off > os[a] then
          os[a] = off
        end
        cs[a] = cs[a] + c
        if cs[a] > MAXC then cs[a] = MAXC end
        total = total + c
      end
    end
  end
  return total
end

-- ringWrite writes record key of a ring (g, n, ttl) with head b from the
-- counts and last offsets carry made, total of them.
-- What follows the ring (tail: a cap, format.go) is written after it.
local function ringWrite(key, cs, os, total, b, g, n, ttl, tail)
  if total > MAXC then total = MAXC end
  local slots = {}
  for i = 1, n + 1 do slots[i] = '\0\0\0\0\0\0' end
  for a, c in pairs(cs) do
    if a > 0 then slots[((b - a) % (n + 1)) + 1] = pack_('>I4I2', c, os[a]) end
  end
  local rec = char(VERSION) .. pack_(RINGFMT, b, total, cs[0] or 0, os[0] or 0) .. table.concat(slots)
  call('SET', key, rec .. (tail or ''), 'PX', itoa(expiry(b, g, n, ttl) - NOWMS))
  return rec
end

-- seed writes the record key of a window (period, g, n, unit, ttl) that
-- the key has none of yet, with its head at b, from the key's record of
-- another period, ss (sg, sn, su), and that period's coarse record, cs2
-- (cg, cn, cu; blocks.go), either false when the key has none: every
-- bucket of either whose last event still counts in the window at now is
-- carried over whole (carry). A bucket whose last event lies past the
-- head bucket (a block still being spent, counted at
-- its end) goes to the window's coarse record C (key, g, n, unit, ttl),
-- when it has one, whose head may run a bucket ahead (blockWrite), so it
-- counts until a period after that end; else the record's head moves to
-- the bucket of that end, one past b at most (which reaches it for a
-- window with no coarse record, whose buckets last a block's life or
-- more), and what the key sends in the meantime counts there too, at
-- that end at the earliest. A coarse record the key has already (C.cur:
-- it outlived the window's record, whose TTL is shorter, while the
-- key's plan lacked the period) is written again with what it counts
-- carried over whole beside what goes to it, and its cap after the
-- ring. It returns the record it wrote, or nil when there was nothing
-- to carry.
-- ringState.seedFrom (state.go) is the same in Go, for one record
-- without a coarse record (the Go model has no blocks).
local function seed(key, ss, sg, sn, su, cs2, cg, cn, cu, period, g, n, unit, ttl, b, now, C)
  -- The newest event's time (each source's head holds its newest).
  local tmax = 0
  if ss then
    local vh, _, _, ho = unpack_(RINGFMT, ss, 2)
    tmax = vh * sg + ho * su
  end
  if cs2 then
    local vh, _, _, ho = unpack_(RINGFMT, cs2, 2)
    if vh * cg + ho * cu > tmax then tmax = vh * cg + ho * cu end
  end
  local cur = C and C.cur
  local ctmax, wroteC = tmax, false
  if cur then
    local vh, _, _, ho = unpack_(RINGFMT, cur, 2)
    if vh * C.g + ho * C.unit > ctmax then ctmax = vh * C.g + ho * C.unit end
  end
  local hi = 2 ^ 53
  if C then
    hi = (b + 1) * g
  elseif tmax > (b + 1) * g then
    -- No coarse record to take what is still being spent: the head moves
    -- to the newest event's bucket, so that it counts until a period
    -- after its end. One past the current at most: an end lies within
    -- a block's life of now, and a window without a coarse record has
    -- buckets that long at least (blockRing).
    b = b + 1
  end
  local cs, os, total = {}, {}, 0
  if ss then total = carry(ss, sg, sn, su, period, g, n, unit, b, now, cs, os, -1, hi) end
  if cs2 then total = total + carry(cs2, cg, cn, cu, period, g, n, unit, b, now, cs, os, -1, hi) end
  if C then
    -- The coarse record's head: the bucket of the newest event's time,
    -- at most one past the current.
    local hb = floor(now / C.g)
    if ctmax > (hb + 1) * C.g then hb = hb + 1 end
    local ccs, cos, ctot = {}, {}, 0
    if ss then ctot = carry(ss, sg, sn, su, period, C.g, C.n, C.unit, hb, now, ccs, cos, hi, 2 ^ 53) end
    if cs2 then ctot = ctot + carry(cs2, cg, cn, cu, period, C.g, C.n, C.unit, hb, now, ccs, cos, hi, 2 ^ 53) end
    if ctot > 0 then
      local tail
      if cur then
        ctot = ctot + carry(cur, C.g, C.n, C.unit, period, C.g, C.n, C.unit, hb, now, ccs, cos, -1, 2 ^ 53)
        tail = sub(cur, WR + (C.n + 1) * SLOT)
      end
      ringWrite(C.key, ccs, cos, ctot, hb, C.g, C.n, C.ttl, tail)
      -- The window's record is written too, empty if need be: another
      -- plan's replicas hold the key to this window (transition windows)
      -- only where it has a record, and read its coarse record with it.
      wroteC = true
    end
  end
  if total <= 0 and not wroteC then return nil end
  return ringWrite(key, cs, os, total, b, g, n, ttl)
end
