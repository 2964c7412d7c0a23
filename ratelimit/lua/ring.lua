-- Decision code, first file after layout.lua (redisdecider.go): shared locals, rings.

-- Bound by init on the first call: a Function's code loads without libraries.
local byte, char, sub, rep, floor, ceil, format, find
local unpack, pcall, type, tostring, tonumber
local unpack_, pack_
local call, KEYS, ARGV, now
-- CMPT: new window records are written compact (format.go): finalized.
local CMPT
local NOWMS
-- OFF[v]: offset v as a string, formatted once (a Function keeps them).
local OFF
local function init()
  byte, char, sub, rep, format, find = string.byte, string.char, string.sub, string.rep, string.format, string.find
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
-- get reads a k-byte big-endian integer at position p of s.
local WIDTH = {'>I1', '>I2', '>I3', '>I4', '>I5', '>I6', '>I7', '>I8'}
local function get(s, p, k)
  return (unpack_(WIDTH[k], s, p))
end

-- cnt and lastAt: bucket j's count and last event's time (none past head vh).
local function cnt(s, R, n, vh, hc, j)
  if j > vh then return 0 end
  if j == vh then return hc end
  return get(s, R + (j % (n + 1)) * SLOT, 4)
end

local function lastAt(s, R, n, g, unit, vh, ho, j)
  if j == vh then return j * g + ho * unit end
  return j * g + get(s, R + (j % (n + 1)) * SLOT + 4, 2) * unit
end

-- zeros(k): k zero bytes, cached (at most 256): empty runs compare in one step.
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

-- Numbers go to redis.call as decimal strings, not Lua's "%.14g".
local function itoa(v) return format('%d', v) end

-- EXPX, EXPS: the last expiry set (ms from NOWMS) and its text.
local EXPX, EXPS = -1, ''

-- expiry is when a record with head b expires (ms; ceil is exact below 2^53):
-- the end of b's epoch (n/4 buckets, at least one) plus ttl (a period, two
-- buckets, 1 ms for NOWMS's rounding): it outlives every event of the epoch,
-- each recorded at most a bucket after it ends. Never earlier than ttl from now
-- (older releases' expiry on every head move), one per epoch for every writer:
-- none shortens another's. Every head move sets it. Relative to NOWMS, never
-- absolute: a long call's later decisions run after Redis's clock passed now.
local function expiry(b, g, n, ttl)
  local E = (n - n % 4) / 4
  if E < 1 then E = 1 end
  return ceil((b - b % E + E) * g / 1000) + ttl
end

-- blank(n): an empty window record, cached (at most 256) rather than built.
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

-- A lease cap's place: a full ring's follows its slots (capAt); a compact
-- record's, while one holds, its entries, which are ENTRY bytes each: its
-- length tells (capOf).
local function capAt(n) return WR - 1 + (n + 1) * SLOT end
local function capOf(s)
  if (#s - WR + 1) % ENTRY == CAPLEN then return sub(s, -CAPLEN) end
  return ''
end

-- holding returns cap c ('' if none) while it holds at now, else ''.
local function holding(c)
  if #c == CAPLEN and unpack_('>I8', c, 5) > now then return c end
  return ''
end

-- full returns record s as a full ring (version 1; a compact one's entries at
-- their slots, its cap after them), or s itself if it is one (or none).
local function full(s, n)
  if not s or byte(s, 1) ~= COMPACT then return s end
  local E = {}
  for p = WR, #s - ENTRY + 1, ENTRY do
    E[#E + 1] = {unpack_('>I8', s, p) % (n + 1), sub(s, p + 8, p + ENTRY - 1)}
  end
  table.sort(E, function(x, y) return x[1] < y[1] end)
  local t, at = {char(VERSION), sub(s, 2, WR - 1)}, 0
  for _, e in ipairs(E) do
    if e[1] > at then t[#t + 1] = zeros((e[1] - at) * SLOT) end
    t[#t + 1] = e[2]
    at = e[1] + 1
  end
  if at <= n then t[#t + 1] = zeros((n + 1 - at) * SLOT) end
  t[#t + 1] = capOf(s)
  return table.concat(t)
end

-- moveCompact rewrites compact record key (header h, read as s if it was) for
-- its head's move from vh (hc, ho) to b: the old head joins the entries and
-- those before b - n leave, and so does a cap that has ended; past MAXENT it is
-- written as a full ring. total is the events counted after the move. It
-- expires in px ms (expiry); the header follows. (A ring of few buckets is
-- never compact past its full size.)
local function moveCompact(key, h, s, n, vh, total, hc, ho, b, px)
  local E, m = {}, 0
  s = s or call('GET', key)
  if total > hc or total >= MAXC then
    for p = WR, #s - ENTRY + 1, ENTRY do
      if unpack_('>I8', s, p) >= b - n then
        m = m + 1
        E[m] = sub(s, p, p + ENTRY - 1)
      end
    end
  end
  if hc > 0 and vh >= b - n then
    m = m + 1
    E[m] = pack_(ENTFMT, vh, hc, ho)
  end
  local rec = sub(h, 1, WR - 1) .. table.concat(E) .. holding(capOf(s))
  if m > MAXENT or m * ENTRY > (n + 1) * SLOT then rec = full(rec, n) end
  call('SET', key, rec, 'PX', px)
end

-- shrink returns full ring s (head vh, hc, ho) as the compact record of its
-- head's move to b (the header follows), with its cap while that holds, or nil
-- when more than MAXENT buckets still hold events or it would be no smaller: a
-- record grown full by a burst goes back to its size once its key quietens.
local function shrink(s, n, vh, hc, ho, b)
  local E, m = {}, 0
  local j, last = b - n, vh - 1
  if j < vh - n then j = vh - n end
  while j <= last do
    -- Eight slots at a time while they hold nothing (no wrap within them).
    local i = j % (n + 1)
    local k = last - j + 1
    if k > 8 then k = 8 end
    if i + k > n + 1 then k = n + 1 - i end
    local p = WR + i * SLOT
    if sub(s, p, p + k * SLOT - 1) ~= zeros(k * SLOT) then
      for q = 0, k - 1 do
        local c, o = unpack_('>I4I2', s, p + q * SLOT)
        if c > 0 then
          m = m + 1
          if m > MAXENT then return nil end
          E[m] = pack_(ENTFMT, j + q, c, o)
        end
      end
    end
    j = j + k
  end
  if hc > 0 and vh >= b - n then
    m = m + 1
    E[m] = pack_(ENTFMT, vh, hc, ho)
  end
  if m > MAXENT or m * ENTRY >= (n + 1) * SLOT then return nil end
  return char(COMPACT) .. sub(s, 2, WR - 1) .. table.concat(E) .. holding(sub(s, capAt(n) + 1, capAt(n) + CAPLEN))
end

-- counts sums slots i0 .. i1 (i0 <= i1) of the ring at R, skipping zero runs.
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

-- untl is when bucket j (last event at l) stops counting: l + period, kept
-- within [(j+n)g, (j+n+1)g], its last span in the ring; no lower bound once
-- head vh is n past j (a coarse record's head may lie ahead: blockWrite).
local function untl(j, l, period, n, g, vh)
  local t = l + period
  local lo, hi = (j + n) * g, (j + n + 1) * g
  if t < lo and not (vh and vh >= j + n) then t = lo end
  if t > hi then t = hi end
  return t
end

-- advanced returns the total once the head moves from vh to b (n slots leave).
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
-- counted: the oldest leaves once its last event is a full period old.
local function used(s, R, n, g, unit, period, vh, hc, ho, total, now, b)
  local j0 = b - n
  local c0 = cnt(s, R, n, vh, hc, j0)
  if c0 > 0 and lastAt(s, R, n, g, unit, vh, ho, j0) + period <= now then return total - c0, j0 + 1 end
  return total, j0
end

-- move sets MV[1..2m] to the m (position, bytes) writes moving the head from
-- vh to b: the old head's slot (if kept) and zeros over the skipped, one write
-- or two on a wrap, a long zero run apart. Positions are 1-based in the slots.
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

-- scan walks buckets from .. b and returns when enough have stopped counting
-- to drop excess events (retry), or with excess 0 when the newest has (reset).
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

-- carry adds to cs, os (counts and last offsets by age from head b) every
-- bucket of ss (sg, sn, su) whose last event t lies in (lo, hi] and still
-- counts at now, whole, in t's bucket clamped into the ring; returns their sum.
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

-- ringWrite writes record key from carry's cs, os and total, then tail (a cap).
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

-- seed writes window record key (head b), which the key lacks, from its record
-- of another period, ss, and that period's coarse record, cs2 (false: none):
-- every bucket whose last event still counts at now, whole. A block still being
-- spent goes to the window's coarse record C, if any, so it counts until a
-- period after its end; one the key has already (C.cur: it outlives the
-- window's shorter TTL) is rewritten keeping its counts and cap. Returns the
-- record, or nil. Go: ringState.seedFrom (state.go), without blocks.
local function seed(key, ss, sg, sn, su, cs2, cg, cn, cu, period, g, n, unit, ttl, b, now, C)
  -- The newest event's time (a record's head holds its newest).
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
    -- No coarse record to take a block still being spent: the head moves
    -- to its end's bucket, one past at most (an end lies within a block's
    -- life, and such a window's buckets are at least that long: blockRing).
    b = b + 1
  end
  local cs, os, total = {}, {}, 0
  if ss then total = carry(ss, sg, sn, su, period, g, n, unit, b, now, cs, os, -1, hi) end
  if cs2 then total = total + carry(cs2, cg, cn, cu, period, g, n, unit, b, now, cs, os, -1, hi) end
  if C then
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
      -- The window's record is written too, even empty: other plans' replicas
      -- enforce this window (transition windows) only where it has a record.
      wroteC = true
    end
  end
  if total <= 0 and not wroteC then return nil end
  return ringWrite(key, cs, os, total, b, g, n, ttl)
end
