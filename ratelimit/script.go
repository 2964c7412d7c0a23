package ratelimit

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// decideCore decides a batch of requests atomically on the Redis server,
// in order, at one reading of the server's clock: for each, the same
// algorithm as keyState.decide (state.go), on the records format.go
// describes. One call serves every decision of a pipeline flush (of one
// Redis Cluster slot), so the call's fixed costs (TIME, Lua call setup,
// command dispatch, decoding each plan's numbers) are paid once per batch,
// not per decision. It runs as a Redis Function where the server has
// them (decideLibrary, FCALL), else as a script (decideLua, EVALSHA).
//
// Two paths make the same decisions. decide serves every plan and every
// request. fast serves the common case, a cold or busy key of a plan of
// one to three windows, with or without a ban rule, and no candidate
// windows (with blocks, the first window's coarse record, if it alone has
// one, read and a block written through decide's own functions), asked only to decide (with no strikes to count), not banned,
// and admitted: the same reads, arithmetic and writes,
// without what the rest would cost it (about a fifth of a cold
// decision's Redis instructions, BENCHMARKS.md). Where decide would
// refuse, fast hands the request to decide before writing anything.
// TestFastPathDecidesAsDecide checks that both leave the same replies
// and bytes; the invariant tests check the windows' promise on both.
//
// Each decision reads the header of each of its windows' records
// (GETRANGE), then only the slots the decision needs (those that leave
// the window as its head moves, and the oldest still in it): every string
// that reaches Lua costs in proportion to its length (Redis's Lua hashes
// every byte of a string it makes), so the code reads, builds and compares
// as few bytes as it can. It writes only the bytes that change (SETRANGE), and
// sets a record's expiry when its head moves (once finalized, only when
// it moves into a new epoch: expiry, in the code); strikes rewrite the
// small ban record with its TTL. No key is ever left without a TTL. Decisions
// of one batch for the same key see each other's writes, in the batch's
// order.
//
// KEYS: each decision's records, one decision after the other: the ban
// record, the window records in the plan's order, the candidate window
// records, the candidate ban record (with a candidate ban policy), the
// coarse records of its short windows (on a plan with blocks, blocks.go),
// then the records of other periods it may take its past from or must
// also fit (seeding, registry.go; their indexes in the seeding numbers
// leave the coarse records out, and the script adds their count). All of one decision's records share its
// key's hash slot; in Redis Cluster a batch holds one slot.
//
// ARGV[1]: the decisions, 8-byte big-endian numbers each: how many KEYS
// it has, its plan (index among the plans below, from 1), how many
// numbers follow, then those: mode (0 decide, 1 peek, 2 decide and
// reserve), extra strikes, lease size wanted, lease room needed, lease
// life (µs) (in mode 2: the most to reserve, 1, the reservation's life,
// then the replicas, the margin, the least to grant, the round trips'
// allowance (µs) and how many of the plan's windows are short: reserve.go,
// reserveSize below), then, when any
// follow, per window the admissions made without Redis to record
// (input.add) and, when a plan edit changed periods, the seeding numbers
// (seeding.nums). None follow (0) for the most common request, asked to
// decide with no strikes and no lease: mode 0, extra 0 and a lease of
// one (want, need and life 1). ARGV[2]: when this release's records were
// finalized (µs, decimal; 0 when not, or not in force: finalize.go).
// ARGV[3p], ARGV[3p+1], ARGV[3p+2]: plan p's numbers packed, its ban multiplier and its candidate ban
// multiplier. The numbers: window count, per window limit, period, bucket
// width, n, offset unit (µs) and record TTL (ms); the ban rule (banRule.appendNums:
// threshold, 0 for none, then the strike window's period, bucket width,
// n, offset unit and TTL, the offence memory, the ban's base and max);
// the candidate window count and per candidate window the same six as a
// window; the candidate ban rule, like the ban rule; on a plan with blocks
// (blocks.go), the count of coarse records and per coarse record its
// window's index, period, bucket width, n, offset unit and TTL.
//
// Leases: an admission counts want admissions at once (a lease) when every
// window has at least need (>= want) remaining; they count in the current
// bucket of every window and may be spent until the lease ends: the end of
// the current bucket of every window, and at most life after now. The
// lease's end is recorded as the bucket's last event, and that time only
// ever grows. Otherwise one admission counts. A reservation (mode 2) is a
// lease of the long windows alone riding on an admission: the request
// counts once in every window, and the reservation's admissions with it
// in the long ones, at the reservation's end; its size and end come back
// in a lease's fields (granted: 1 + the size).
//
// Reply: one string per decision, in order. A decision's string is 8-byte
// big-endian signed integers (decode reads it), in one of three forms.
// The short form is the reply to a request admitted alone (granted one
// admission, no lease) under a plan with no candidate windows, most
// requests' reply: now; with a ban rule the strikes, ban end and
// offences; then per window used and reset (outcome and retry are 0, the
// admissions granted 1, the lease end 0, no ban began). The bare form is
// the short one without the ban rule's fields, under a plan without one
// or when all three are 0 (a key with no ban record: most keys). Every
// other reply is the whole form, only the fields the plan has:
// outcome, retry, now, admissions granted, lease end; with a ban rule, new
// ban, strikes, ban end, offences; with candidate windows, what they would
// have decided for this request (outcome) and how many requests they
// admitted, limited and refused as banned, and with a candidate ban rule
// whether a candidate ban began, the candidate strikes, ban end and
// offences; then per window used and reset, then the same per candidate
// window. Times in µs. A decision that failed (a record of another type,
// say) is "E" and the error, and does not stop the others.
var decideCore = expandLua(`
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
` + codecLua + `
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
-- head bucket (a block or a reservation still being spent, counted at
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

-- Window working values, by index (windows 1..nw, then transition
-- windows, then candidate windows), in arrays reused by every decision of
-- the batch, so that a decision allocates almost nothing: the record's
-- key, its header as read, whether it is new, its head, total, head
-- count and offset as read, the current bucket, the events counted now,
-- the first bucket counted, and the admissions made elsewhere being
-- added.
local WKEY, WH, WFRESH, WVH, WTOT, WHC, WHO, WB, WUSED, WFROM, WADD = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}

-- The lease cap (format.go): a window record's extension after its ring,
-- the lowest limit under which a lease on the window may still be spent
-- (4 bytes) and until when (8, µs). A lease's end is its bucket's last
-- event (and that only grows), so while one may still be spent, the head
-- bucket is the current one, holds two events or more, and its last event
-- lies ahead: only then is the cap read. WCAP and WCEND hold window i's
-- cap and its end as read (nil: none in force). Both decision paths read
-- and write it through the same code (capReadLua, capWriteLua): decide by
-- these functions, fast with the code written out in it.
local CAPFMT, CAPLEN = '>I4I8', 12
local WCAP, WCEND = {}, {}
local function capAt(n) return WR - 1 + (n + 1) * SLOT end
local function readCap(key, n, g, unit, b, vh, hc, ho)
  local cap, cend
  --@capread()
  return cap, cend
end
local function writeCap(key, n, l, lend, cap, cend)
  --@capwrite()
end

-- window reads window record key (header h already read: '' when none)
-- at now: whether it is new, its head, total, head count and offset as
-- read, the current bucket, the events counted now and the first bucket
-- counted. It reads the slots that advanced and used need: those leaving
-- the ring as the head moves, and the oldest still in it. The same as
-- advanced and used above, written out for the common case. Both
-- decision paths see a window through its code (windowLua): decide by
-- this function, fast with the code written out in it.
local function window(key, h, period, g, n, unit)
  local fresh, vh, total, hc, ho, b, c, from
  --@window()
  return fresh, vh, total, hc, ho, b, c, from
end

-- view sets window i's working values (window) from record key.
local function view(i, key, h, period, g, n, unit)
  local fresh, vh, total, hc, ho, b, c, from = window(key, h, period, g, n, unit)
  WKEY[i], WH[i], WFRESH[i], WVH[i], WTOT[i], WHC[i], WHO[i], WB[i], WUSED[i], WFROM[i], WADD[i] = key, h, fresh, vh, total, hc, ho, b, c, from, 0
end

-- write counts count events at time at in the current bucket b of
-- window record key (new or not, with header h, and head vh, total, head
-- count hc and offset ho as read from it): one header write (and the
-- slots the head leaves behind when it moves, with a TTL refresh), or the
-- whole record when it is new. It returns the record's total, head count and head offset
-- after. Its code (writeLua) is also written out in fast.
local function write(key, h, fresh, vh, total, hc, ho, b, count, at, g, n, unit, ttl)
  local off
  --@write()
  return total + count, hc + count, off
end

-- record counts k events at time t in the current bucket of window i
-- (write). The record then has this head; a rejection scans it below.
local function record(i, k, t, g, n, unit, ttl)
  local b = WB[i]
  WTOT[i], WHC[i], WHO[i] = write(WKEY[i], WH[i], WFRESH[i], WVH[i], WTOT[i], WHC[i], WHO[i], b, k, t, g, n, unit, ttl)
  WFRESH[i], WVH[i] = false, b
end

-- blockWrite counts a block of k admissions ending at t in coarse record
-- y (window working values), in the bucket of its end, e: at most one
-- past the current one (the grant's end is capped so), which the record
-- holds as it holds n + 1 buckets for a period of n - 1 (blockRing). At
-- or past the head, the head moves there first (the record viewed at e's
-- start, its count as read now kept) and the block is written there;
-- before it (a block ending later moved it on), into e's slot.
local function blockWrite(y, k, t, period, g, n, unit, ttl)
  local e = floor((t - 1) / g)
  if e >= WB[y] then
    if e > WB[y] then
      local u, at = WUSED[y], now
      now = e * g
      view(y, WKEY[y], WH[y], period, g, n, unit)
      -- (One at a time: miniredis's Lua assigns a list in turn.)
      now = at
      WUSED[y] = u
    end
    record(y, k, t, g, n, unit, ttl)
    return
  end
  local key, p = WKEY[y], 1 + HDR + (e % (n + 1)) * SLOT
  local c, o = unpack_('>I4I2', call('GETRANGE', key, OFF[p], OFF[p + SLOT - 1]), 1)
  c = c + k
  if c > MAXC then c = MAXC end
  local d = t - e * g
  local off = (d + unit - 1 - (d + unit - 1) % unit) / unit
  if o > off then off = o end
  call('SETRANGE', key, OFF[p], pack_('>I4I2', c, off))
  local total = WTOT[y] + k
  if total > MAXC then total = MAXC end
  call('SETRANGE', key, '1', pack_(RINGFMT, WVH[y], total, WHC[y], WHO[y]))
  WTOT[y] = total
end

-- resetAt is when the head bucket b of a window stops counting, its last
-- event at offset off: untl, for the bucket that holds the newest event.
-- Its code (resetLua) is also written out in fast.
local function resetAt(b, off, period, g, n, unit)
  local reset
  --@reset()
  return reset
end

-- standing returns window i's used, remaining and reset after the
-- decision, and (for a refused request whose window is full) how long
-- until the window admits one more.
local function standing(i, limit, period, g, n, unit, counted, refused)
  local u, reset_, wait = WUSED[i], now, 0
  if counted > 0 then
    u = u + counted
    reset_ = resetAt(WB[i], WHO[i], period, g, n, unit)
  elseif u > 0 then
    -- A rejection or a peek scans the window: read it whole.
    local s = call('GET', WKEY[i])
    local vh, hc, ho, from, b = WVH[i], WHC[i], WHO[i], WFROM[i], WB[i]
    reset_ = scan(s, WR, n, g, unit, period, vh, hc, ho, from, b, 0, now)
    local cap, cend = WCAP[i], WCEND[i]
    if refused and cap and cap < limit and u >= cap then
      -- Held to a lease's cap: admitted again once enough has slid out
      -- to fit under it, or once it ends and the window fits its own
      -- limit, whichever comes first.
      local t = now
      if u >= limit then t = scan(s, WR, n, g, unit, period, vh, hc, ho, from, b, u - limit + 1, now) end
      if cend > t then t = cend end
      local under = scan(s, WR, n, g, unit, period, vh, hc, ho, from, b, u - cap + 1, now)
      if under < t then t = under end
      wait = t - now
    elseif refused and u >= limit then
      wait = scan(s, WR, n, g, unit, period, vh, hc, ho, from, b, u - limit + 1, now) - now
    end
  end
  local rem = limit - u
  if rem < 0 then rem = 0 end
  return u, rem, reset_, wait
end

-- newest returns when the newest bucket of ring w (working values) that
-- counts stops counting, counted events having just been written at its
-- head (record); now when none counts. The head as read is the newest
-- bucket with events, and counts while the ring counts any: only a head
-- emptied by a give-back needs the ring read.
local function newest(w, period, g, n, unit, counted)
  if counted > 0 or WHC[w] > 0 and WUSED[w] > 0 then return resetAt(WVH[w], WHO[w], period, g, n, unit) end
  if WUSED[w] <= 0 then return now end
  local s = call('GET', WKEY[w])
  return scan(s, WR, n, g, unit, period, WVH[w], WHC[w], WHO[w], WFROM[w], WB[w], 0, now)
end

-- scan2 is scan over a window's two records, its own ring (working
-- values a, read whole as sa) and its coarse one (y, sy): when enough
-- events have stopped counting to drop excess, the buckets of both taken
-- in the order they stop counting (each ring's in bucket order: bucket j
-- stops within [(j+n)g, (j+n+1)g]). now when they never do.
local function scan2(sa, a, g, n, unit, sy, y, cg, cn, cunit, period, excess)
  local ja, jy, acc = WFROM[a], WFROM[y], 0
  local ca, ta, cy, ty = 0, 0, 0, 0
  while true do
    while ca == 0 and ja <= WB[a] do
      ca = cnt(sa, WR, n, WVH[a], WHC[a], ja)
      if ca > 0 then ta = untl(ja, lastAt(sa, WR, n, g, unit, WVH[a], WHO[a], ja), period, n, g) end
      ja = ja + 1
    end
    while cy == 0 and jy <= WB[y] do
      cy = cnt(sy, WR, cn, WVH[y], WHC[y], jy)
      if cy > 0 then ty = untl(jy, lastAt(sy, WR, cn, cg, cunit, WVH[y], WHO[y], jy), period, cn, cg, WVH[y]) end
      jy = jy + 1
    end
    local c, t
    if ca > 0 and (cy == 0 or ta <= ty) then
      c, t, ca = ca, ta, 0
    elseif cy > 0 then
      c, t, cy = cy, ty, 0
    else
      return now
    end
    acc = acc + c
    if acc >= excess then return t end
  end
end

-- pairStanding is standing for window i, which also counts its coarse
-- record's blocks (window y, coarse geometry cg, cn, cunit): used is the
-- sum of both, reset the later of their newest buckets' ends, and a
-- refused request's wait the earliest time the sum fits under the limit
-- and every cap (of either record) still in force then: for each span
-- between cap ends, the time enough has slid out of both (scan2) to fit
-- that span's lowest limit, no earlier than the span's start. counted
-- and ccounted are the events this decision wrote in each.
local function pairStanding(i, y, limit, period, g, n, unit, cg, cn, cunit, counted, ccounted, refused)
  local u = WUSED[i] + WUSED[y] + counted + ccounted
  local reset_, wait = now, 0
  if u > 0 then
    reset_ = newest(i, period, g, n, unit, counted)
    local r = newest(y, period, cg, cn, cunit, ccounted)
    if r > reset_ then reset_ = r end
  end
  if refused and u > 0 then
    -- The caps below the limit, c1 the one that ends first.
    local c1, e1, c2, e2
    if WCAP[i] and WCAP[i] < limit then c1, e1 = WCAP[i], WCEND[i] end
    if WCAP[y] and WCAP[y] < limit then
      if c1 then c2, e2 = WCAP[y], WCEND[y] else c1, e1 = WCAP[y], WCEND[y] end
    end
    if c2 and e2 < e1 then
      local c, e = c1, e1
      c1, e1 = c2, e2
      c2, e2 = c, e
    end
    local sa, sy
    local best
    local start = now
    for r = 0, 2 do
      local l = limit
      if r < 1 and c1 and c1 < l then l = c1 end
      if r < 2 and c2 and c2 < l then l = c2 end
      local t = start
      if u >= l then
        if not sa then sa, sy = call('GET', WKEY[i]), call('GET', WKEY[y]) end
        t = scan2(sa, i, g, n, unit, sy, y, cg, cn, cunit, period, u - l + 1)
        if t < start then t = start end
      end
      if not best or t < best then best = t end
      if r == 0 then
        if not c1 then break end
        start = e1
      elseif r == 1 then
        if not c2 then break end
        start = e2
      end
    end
    wait = best - now
  end
  local rem = limit - u
  if rem < 0 then rem = 0 end
  return u, rem, reset_, wait
end

-- banRead reads ban record bs (false: none) of ban rule R at now: the
-- ban's end, the offences still remembered, the last offence, and whether
-- its strike ring is of R's strike window (strikes of another do not
-- count toward R's).
local function banRead(bs, R)
  if not bs or #bs < 37 then return 0, 0, 0, false end
  local banUntil, offences, offenceAt = get(bs, 2, 8), get(bs, 10, 4), get(bs, 14, 8)
  if offences > 0 and offenceAt + R.memory <= now then offences = 0 end
  local sring = get(bs, 22, 8) == R.sp and get(bs, 30, 8) == R.sg and #bs >= 37 + HDR + (R.sn + 1) * SLOT
  return banUntil, offences, offenceAt, sring
end

-- strike counts k strikes at now in ban record key (content bs, read by
-- banRead as banUntil, offences, offenceAt, sring) of ban rule R, when
-- record: when they cross R's threshold the key is banned (for longer
-- with each offence still remembered) and the strikes start over; the
-- record is rewritten with its TTL. It returns whether a ban began (1),
-- how many of the k counted before it began (the one that began it
-- included), the strikes counted now, the ban's end (0: not banned) and
-- the offences remembered. banState.strike (state.go) is the same in Go.
local function strike(key, bs, R, banUntil, offences, offenceAt, sring, k, record)
  local sp, sg, sn, su = R.sp, R.sg, R.sn, R.su
  local newBan, struck, strikes = 0, 0, 0
  record = record and k > 0
  if record or sring then
    if not sring then
      -- A new strike ring (of this strike window's geometry).
      bs = pack_('>I1I8I4I8I8I8', VERSION, banUntil, offences, offenceAt, sp, sg) .. rep('\0', HDR) .. rep(EMPTY, sn + 1)
    end
    local R0 = 38 + HDR
    local vh, total, hc, ho = unpack_(RINGFMT, bs, 38)
    local b = floor(now / sg)
    if b < vh then b = vh end
    total = advanced(bs, R0, sn, vh, total, b)
    if record then
      local need = R.thr - used(bs, R0, sn, sg, su, sp, vh, hc, ho, total, now, b) + 1
      if need < 1 then need = 1 end
      struck = k
      if k >= need then struck, newBan = need, 1 end
      if b > vh then
        for q = 1, 2 * move(sn, vh, hc, ho, b), 2 do
          bs = sub(bs, 1, R0 + MV[q] - 2) .. MV[q + 1] .. sub(bs, R0 + MV[q] - 1 + #MV[q + 1])
        end
        hc = 0
      end
      hc = hc + struck
      if hc > MAXC then hc = MAXC end
      total = total + struck
      if total > MAXC then total = MAXC end
      local off = ceil((now - b * sg) / su)
      if off < 0 then off = 0 end
      if hc > struck and ho > off then off = ho end
      ho, vh = off, b
      if newBan == 1 then
        offences = offences + 1
        if offences > MAXC then offences = MAXC end
        offenceAt = now
        -- The ban's length is banRule.length: base*mult^(offences-1), capped.
        local d, cap = R.base, 2 ^ 50
        if R.max > 0 then cap = R.max end
        local j = 1
        while j < offences and d < cap and R.mult > 1 do
          d = d * R.mult
          j = j + 1
        end
        if d > cap then d = cap end
        d = floor(d)
        if d < 1 then d = 1 end
        banUntil = now + d
        total, hc, ho = 0, 0, 0
        bs = sub(bs, 1, R0 - 1) .. rep(EMPTY, sn + 1)
      end
      bs = pack_('>I1I8I4I8I8I8', VERSION, banUntil, offences, offenceAt, sp, sg) .. pack_(RINGFMT, vh, total, hc, ho) .. sub(bs, R0)
      local e = banUntil
      if offenceAt + R.memory > e then e = offenceAt + R.memory end
      if now + R.sttl * 1000 > e then e = now + R.sttl * 1000 end
      call('SET', key, bs, 'PX', itoa(ceil((e - now) / 1000) + 1))
    end
    strikes = used(bs, R0, sn, sg, su, sp, vh, hc, ho, total, now, b)
  end
  if banUntil <= now then banUntil = 0 end
  return newBan, struck, strikes, banUntil, offences
end

-- firstIn returns the first of slots i0 .. i1 (i0 <= i1) of ring slots s
-- (slot 0 at position 1) that holds a count, nil when none does; runs of
-- 8 empty slots are skipped whole, as counts skips them.
local function firstIn(s, i0, i1)
  local p, last = 1 + i0 * SLOT, 1 + (i1 + 1) * SLOT
  while p < last do
    local q = p + RUN
    if q > last then q = last end
    if sub(s, p, q - 1) ~= zeros(q - p) then
      for r = p, q - 1, SLOT do
        if unpack_('>I4', s, r) > 0 then return (r - 1) / SLOT end
      end
    end
    p = q
  end
  return nil
end

-- demandSpan returns the time a reservation's size takes the key's
-- demand to have built up over (reserveSize): the period sp of its last
-- short window, whose record key (bucket width g, n, and as window read
-- it head vh, total, head count hc and first bucket counted from) counts
-- that demand; or, while the oldest bucket of the record that holds a
-- request (now when none does) began less than sp - life ago, the time
-- since it began plus life, a reservation's life. Every admission the
-- window counts was decided in that bucket or later, or spent from a
-- block granted by a round trip before it, within its life (at most
-- life); a key the window has held for less than its period would
-- otherwise read as sending at a fraction of its rate until a period had
-- passed. At least life: a new key reserves at most what it has sent.
local function demandSpan(key, sp, g, n, vh, total, hc, from, life)
  local t0 = now
  if total > 0 and from <= vh then
    local j = vh
    if total ~= hc and from < vh then
      local s = call('GETRANGE', key, OFF[1 + HDR], OFF[HDR + (n + 1) * SLOT])
      local i0, i1 = from % (n + 1), (vh - 1) % (n + 1)
      local x
      if i0 <= i1 then x = firstIn(s, i0, i1) else x = firstIn(s, i0, n) or firstIn(s, 0, i1) end
      if x then j = from + (x - i0) % (n + 1) end
    end
    t0 = j * g
  end
  local a = now - t0 + life
  if a < sp then return a end
  return sp
end

-- reserveSize returns the admissions of the long windows to reserve
-- beside a request admitted now (mode 2, reserve.go), worked out from the
-- counts its decision read: the requests the last short window counts
-- with this one (sc), at their rate over its period (sp, µs) or, for a
-- key the window has held for less, over the time since the oldest of
-- them (demandSpan, given the window's record key and what window read
-- of it, g .. from), scaled to the time the reservation could be spent
-- (rest, µs: until its end) less the round trips' allowance (RSV[4]);
-- at most RSV[6] (the replica's
-- own share of that demand), and at most what leaves every long window
-- the margin (RSV[2]) times the size times the replicas (RSV[1])
-- remaining (lroom: the least any long window has left after this
-- request); 0 below RSV[3]. Its end is the end of every long window's
-- current bucket, at most RSV[7] after now. The record is read for its
-- oldest request only when the caps leave the span to decide the size.
local function reserveSize(sc, sp, lroom, rest, RSV, key, g, n, vh, total, hc, from)
  local num = sc * (rest - RSV[4])
  if num <= 0 or lroom <= 0 then return 0 end
  local most = RSV[6]
  local m = floor(lroom / (RSV[2] * RSV[1]))
  if m < most then most = m end
  if most < RSV[3] or most < 1 then return 0 end
  local k = num / sp
  if k < most and sp > RSV[7] then
    sp = demandSpan(key, sp, g, n, vh, total, hc, from, RSV[7])
    k = num / sp
  end
  -- A product past 2^52 may be rounded up: one less keeps the floor
  -- from rising above the exact quotient's (the sizes that matter, at
  -- most RSV[6], are far smaller than such a quotient's error).
  if num > 2 ^ 52 then k = k - 1 end
  k = floor(k)
  if k > most then k = most end
  if k < RSV[3] or k < 1 then return 0 end
  return k
end

-- The reply's numbers, reused by every decision.
local RES = {}

-- decide evaluates one decision whose records are KEYS[base + 1 ..
-- base + nk], under plan pl (its numbers V, ban multiplier, reply format
-- and TTLs in ms), asked mode, extra, want, need and life, with
-- ADD[i] admissions to add per window and the seeding numbers SEED (or
-- nil), and returns its reply.
local function decide(base, pl, mode, extra, want, need, life, ADD, SEED, RSV)
  local V = pl.V
  local nw = V[1]
  -- Blocks (pl.nco > 0): each short window's coarse record (CO[x] for
  -- window CO[x].i, CP[i] = x) is window nw + x, and its record is KEYS
  -- base + pl.kco + x, after the plan's own; the records of other
  -- periods (seeding) follow them. Transition windows start after them
  -- (tb).
  local nco, CO, CP = pl.nco, pl.CO, pl.CP
  local tb = nw + nco

  -- After a plan changed its periods: where a window the key has no
  -- record of may take its past from (the number of sources, each as
  -- (KEYS index, period, g, n, unit) and its period's coarse record as
  -- (KEYS index, g, n, unit), index 0 for none, then per window the
  -- number of sources to try, in order, and their indexes), then the
  -- transition windows, enforced beside the plan's own where the key has a
  -- record of them (another plan's windows, while an edit spreads over the
  -- replicas): their number, each as (KEYS index, limit, period, g, n,
  -- unit, ttl) and its coarse record as a source's. An index past the
  -- plan's windows' is another period's record, after the coarse records
  -- in KEYS (the numbers leave those out: at); a source that is one of the
  -- plan's windows has that window's coarse record, if any (CO).
  local SRC, TRY, TRANS
  if SEED then
    SRC, TRY, TRANS = {}, {}, {}
    local function at(k)
      if k > 1 + nw then return k + nco end
      return k
    end
    local o = 1
    local ns = SEED[o]
    for s = 1, ns do
      local q = o + 1 + 9 * (s - 1)
      local k, ck, cg, cn, cu = SEED[q], SEED[q + 5], SEED[q + 6], SEED[q + 7], SEED[q + 8]
      local x = k <= 1 + nw and CP and CP[k - 1]
      if x then ck, cg, cn, cu = pl.kco + x, CO[x].g, CO[x].n, CO[x].unit elseif ck > 0 then ck = at(ck) end
      SRC[s] = {at(k), SEED[q + 1], SEED[q + 2], SEED[q + 3], SEED[q + 4], ck, cg, cn, cu}
    end
    o = o + 1 + 9 * ns
    for i = 1, nw do
      local k = SEED[o]
      TRY[i] = {}
      for m = 1, k do TRY[i][m] = SEED[o + m] end
      o = o + 1 + k
    end
    for j = 1, SEED[o] do
      local q = o + 1 + 11 * (j - 1)
      local ck = SEED[q + 7]
      if ck > 0 then ck = at(ck) end
      TRANS[j] = {at(SEED[q]), SEED[q + 1], SEED[q + 2], SEED[q + 3], SEED[q + 4], SEED[q + 5], SEED[q + 6], ck, SEED[q + 8], SEED[q + 9], SEED[q + 10]}
    end
  end
  local peek = mode == 1

  -- The ban record.
  local R = pl.ban
  local bs, banUntil, offences, offenceAt, sring
  if R then
    bs = call('GET', KEYS[base + 1])
    banUntil, offences, offenceAt, sring = banRead(bs, R)
  end
  local banned = R and banUntil > now
  local admit = not banned
  local room, lend = -1, now + life

  -- Windows.
  for i = 1, nw do
    local o = 2 + 6 * (i - 1)
    local limit, period, g, n, unit = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4]
    local key = KEYS[base + 1 + i]
    local h = call('GETRANGE', key, '0', '18')
    if #h < 1 + HDR and TRY and TRY[i] then
      -- A period the key has no record of, after a plan edit: start from
      -- the best record of another period the key has.
      -- (A record of that period, or its coarse record: blocks count
      -- there alone.)
      for _, si in ipairs(TRY[i]) do
        local src = SRC[si]
        local ss, cs2 = call('GET', KEYS[base + src[1]]), false
        if not (ss and #ss >= 1 + HDR + (src[4] + 1) * SLOT) then ss = false end
        if src[6] > 0 then
          cs2 = call('GET', KEYS[base + src[6]])
          if not (cs2 and #cs2 >= 1 + HDR + (src[8] + 1) * SLOT) then cs2 = false end
        end
        if ss or cs2 then
          -- The window's coarse record, if it has one, takes what is
          -- still being spent: a new one, or the key's (cur), which
          -- seed writes again with what it holds (a record too short
          -- for its ring is another format's: left alone).
          local x, C = CP and CP[i], nil
          if x then
            local cr, ck = CO[x], KEYS[base + pl.kco + x]
            local cur = call('GET', ck)
            if cur and #cur < 1 + HDR then cur = false end
            if not cur or #cur >= WR - 1 + (cr.n + 1) * SLOT then
              C = {key = ck, g = cr.g, n = cr.n, unit = cr.unit, ttl = cr.ttl, cur = cur}
            end
          end
          if seed(key, ss, src[3], src[4], src[5], cs2, src[7], src[8], src[9], period, g, n, unit, pl.TTL[i], floor(now / g), now, C) then
            h = call('GETRANGE', key, '0', '18')
          end
          break
        end
      end
    end
    view(i, key, h, period, g, n, unit)
    -- Admissions made locally while Redis was unreachable count first, as
    -- made now: at most the window's limit, since no interval held more.
    local add = ADD[i]
    if add > 0 and not peek then
      if add > limit then add = limit end
      WADD[i] = add
      WUSED[i] = WUSED[i] + add
    end
    -- A lease still being spent holds this decision to the lease's
    -- limit too (one under another plan, while replicas disagree).
    WCAP[i], WCEND[i] = readCap(key, n, g, unit, WB[i], WVH[i], WHC[i], WHO[i])
    if WCAP[i] and WCAP[i] < limit then limit = WCAP[i] end
    local c = WUSED[i]
    local x = CP and CP[i]
    if x then
      -- The window counts its coarse record's blocks too, and is held to
      -- a cap on either.
      local cr, y = CO[x], nw + x
      local ck = KEYS[base + pl.kco + x]
      view(y, ck, call('GETRANGE', ck, '0', '18'), period, cr.g, cr.n, cr.unit)
      WCAP[y], WCEND[y] = readCap(ck, cr.n, cr.g, cr.unit, WB[y], WVH[y], WHC[y], WHO[y])
      if WCAP[y] and WCAP[y] < limit then limit = WCAP[y] end
      c = c + WUSED[y]
    end
    if c >= limit then admit = false end
    if room < 0 or limit - c < room then room = limit - c end
    if (WB[i] + 1) * g < lend then lend = (WB[i] + 1) * g end
  end

  -- Transition windows: another plan's windows, while an edit spreads.
  -- Where the key has a record of one, an admission here must fit it too
  -- and counts in it, so replicas still on that plan see it.
  local TX, ntx = nil, 0
  if TRANS then
    TX = {}
    for j = 1, #TRANS do
      local tr = TRANS[j]
      local key = KEYS[base + tr[1]]
      local h = call('GETRANGE', key, '0', '18')
      if #h >= 1 + HDR then
        ntx = ntx + 1
        local x = tb + ntx
        TX[ntx] = tr
        view(x, key, h, tr[3], tr[4], tr[5], tr[6])
        WCAP[x], WCEND[x] = readCap(key, tr[5], tr[4], tr[6], WB[x], WVH[x], WHC[x], WHO[x])
        local limit = tr[2]
        if WCAP[x] and WCAP[x] < limit then limit = WCAP[x] end
        local c = WUSED[x]
        if tr[8] > 0 then
          -- Its coarse record's blocks count too (working values -ntx),
          -- as in the plan's own windows.
          local ck = KEYS[base + tr[8]]
          view(-ntx, ck, call('GETRANGE', ck, '0', '18'), tr[3], tr[9], tr[10], tr[11])
          WCAP[-ntx], WCEND[-ntx] = readCap(ck, tr[10], tr[9], tr[11], WB[-ntx], WVH[-ntx], WHC[-ntx], WHO[-ntx])
          if WCAP[-ntx] and WCAP[-ntx] < limit then limit = WCAP[-ntx] end
          c = c + WUSED[-ntx]
        end
        if c >= limit then admit = false end
        if room < 0 or limit - c < room then room = limit - c end
        if (WB[x] + 1) * tr[4] < lend then lend = (WB[x] + 1) * tr[4] end
      end
    end
  end

  -- granted admissions count at once; at is the time recorded for them.
  local granted, at = 1, now
  if want > 1 and room >= need and room >= want then granted, at = want, lend else lend = 0 end
  local admitted = admit and not peek

  -- A reservation riding on this admission (RSV, reserveSize): rk more
  -- admissions of the long windows (those after the first RSV[5]),
  -- counted with this one at the reservation's end rend. With blocks
  -- (nco > 0: every short window has a coarse record), a block: the rk
  -- count in the short windows too, in their coarse records, at rend,
  -- which is then also within their current coarse buckets.
  local rk, rend, ns = 0, 0, 0
  if RSV and admitted and ntx == 0 and (nco == 0 or nco == RSV[5]) then
    ns, rend = RSV[5], now + RSV[7]
    local lroom = 2 ^ 53
    for i = ns + 1, nw do
      local o = 2 + 6 * (i - 1)
      local limit = V[o]
      if WCAP[i] and WCAP[i] < limit then limit = WCAP[i] end
      if limit - WUSED[i] - 1 < lroom then lroom = limit - WUSED[i] - 1 end
      if (WB[i] + 1) * V[o + 2] < rend then rend = (WB[i] + 1) * V[o + 2] end
    end
    local sc = WUSED[ns] + 1
    if nco > 0 then
      for i = 1, ns do
        local x = CP[i]
        local y, g = nw + x, CO[x].g
        local limit = V[2 + 6 * (i - 1)]
        if WCAP[i] and WCAP[i] < limit then limit = WCAP[i] end
        if WCAP[y] and WCAP[y] < limit then limit = WCAP[y] end
        local r = limit - WUSED[i] - WUSED[y] - 1
        if r < lroom then lroom = r end
        -- Within the bucket after the current one (blockWrite).
        local last = (floor(now / g) + 2) * g
        if last < rend then rend = last end
      end
      sc = sc + WUSED[nw + CP[ns]]
    end
    local o = 2 + 6 * (ns - 1)
    rk = reserveSize(sc, V[o + 1], lroom, rend - now, RSV, WKEY[ns], V[o + 2], V[o + 3], WVH[ns], WTOT[ns], WHC[ns], WFROM[ns])
    if rk == 0 then rend = 0 end
  end

  for i = 1, nw do
    local k, t = WADD[i], now
    if admitted then k, t = k + granted, at end
    if rk > 0 and i > ns then k, t = k + rk, rend end
    if k > 0 then
      local o = 2 + 6 * (i - 1)
      record(i, k, t, V[o + 2], V[o + 3], V[o + 4], pl.TTL[i])
    end
  end
  if rk > 0 and nco > 0 then
    for x = 1, nco do
      local cr = CO[x]
      blockWrite(nw + x, rk, rend, V[2 + 6 * (cr.i - 1) + 1], cr.g, cr.n, cr.unit, cr.ttl)
    end
  end
  if admitted then
    for j = 1, ntx do
      local tr = TX[j]
      record(tb + j, granted, at, tr[4], tr[5], tr[6], tr[7])
    end
  end
  -- A lease caps every window it counts in until it ends.
  if admitted and granted > 1 then
    for i = 1, nw do writeCap(WKEY[i], V[2 + 6 * (i - 1) + 3], V[2 + 6 * (i - 1)], lend, WCAP[i], WCEND[i]) end
    for j = 1, ntx do writeCap(WKEY[tb + j], TX[j][5], TX[j][2], lend, WCAP[tb + j], WCEND[tb + j]) end
  end
  -- And a reservation every long window, a block every coarse record too.
  if rk > 0 then
    for i = ns + 1, nw do writeCap(WKEY[i], V[2 + 6 * (i - 1) + 3], V[2 + 6 * (i - 1)], rend, WCAP[i], WCEND[i]) end
    for x = 1, nco do
      local y = nw + x
      writeCap(WKEY[y], CO[x].n, V[2 + 6 * (CO[x].i - 1)], rend, WCAP[y], WCEND[y])
    end
  end

  -- Candidate windows: evaluated on every request that reaches the script
  -- (this one, and the extra rejections answered locally since the last
  -- round trip, in turn), never refusing one. Records of their own, so
  -- that a candidate never touches an enforced window's count. A key its
  -- ban policy bans, it would refuse; of the others it admits (and
  -- counts) as many as fit, as if it were the only windows, and limits
  -- the rest, each a strike of its ban policy; the strike that begins a
  -- ban is refused as banned, as are those after it.
  local co = pl.co
  local nc = V[co]
  local cb = tb + ntx
  local croom = -1
  for i = 1, nc do
    local o = co + 1 + 6 * (i - 1)
    local limit, period, g, n, unit = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4]
    local key = KEYS[base + 1 + nw + i]
    view(cb + i, key, call('GETRANGE', key, '0', '18'), period, g, n, unit)
    if croom < 0 or limit - WUSED[cb + i] < croom then croom = limit - WUSED[cb + i] end
  end
  local CR = pl.cban
  local cbkey, cbs, cbUntil, cbOff, cbAt, cbRing
  if CR then
    cbkey = KEYS[base + 2 + nw + nc]
    cbs = call('GET', cbkey)
    cbUntil, cbOff, cbAt, cbRing = banRead(cbs, CR)
  end
  local cOut, cAdm, cLim, cBan = 0, 0, 0, 0
  if nc > 0 and not peek then
    local k = 1 + extra
    if CR and cbUntil > now then
      cBan, cOut = k, 2
    else
      if croom < 0 then croom = 0 end
      cAdm = k
      if cAdm > croom then cAdm = croom end
      cLim = k - cAdm
      if croom <= extra then cOut = 1 end
      if cAdm > 0 then
        for i = 1, nc do
          local o = co + 1 + 6 * (i - 1)
          record(cb + i, cAdm, now, V[o + 2], V[o + 3], V[o + 4], pl.CTTL[i])
        end
      end
    end
  end
  local cNewBan, cStrikes, cBanUntil, cOffences = 0, 0, 0, 0
  if CR then
    local struck
    cNewBan, struck, cStrikes, cBanUntil, cOffences = strike(cbkey, cbs, CR, cbUntil, cbOff, cbAt, cbRing, cLim, not peek and cLim > 0)
    if cNewBan == 1 then
      -- (One at a time: miniredis's Lua assigns a list in turn.)
      cBan = cLim - struck + 1
      cOut, cLim = 2, struck - 1
    end
  end

  -- Strikes: this rejection and those answered locally since the last
  -- round trip (extra), unless the key is banned.
  local newBan, strikes = 0, 0
  if R then
    local k = extra
    if not admit and not banned then k = k + 1 end
    local struck
    newBan, struck, strikes, banUntil, offences = strike(KEYS[base + 1], bs, R, banUntil, offences, offenceAt, sring, k, not peek and not banned)
    if newBan == 1 then banned = true end
  else
    banUntil, offences = 0, 0
  end

  if not admitted then granted, lend = 0, 0 end
  -- The reply carries only what the plan has (decode reads it). A
  -- reservation's size and end take a lease's fields: the decision's own
  -- admission and the rk reserved ones, until rend.
  local rt = 0
  RES[1], RES[2], RES[3], RES[4], RES[5] = 0, 0, now, granted, lend
  if rk > 0 then RES[4], RES[5] = granted + rk, rend end
  local m = 5
  if R then
    RES[6], RES[7], RES[8], RES[9] = newBan, strikes, banUntil, offences
    m = 9
  end
  if nc > 0 then
    RES[m + 1], RES[m + 2], RES[m + 3], RES[m + 4] = cOut, cAdm, cLim, cBan
    m = m + 4
    if CR then
      RES[m + 1], RES[m + 2], RES[m + 3], RES[m + 4] = cNewBan, cStrikes, cBanUntil, cOffences
      m = m + 4
    end
  end
  for i = 1, nw do
    local o = 2 + 6 * (i - 1)
    local limit, period, g, n, unit = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4]
    local counted = 0
    if admitted then counted = granted end
    if rk > 0 and i > ns then counted = counted + rk end
    -- A refused request (banned or limited) waits for every full window
    -- as well as for the ban: Retry-After is the true wait.
    local u, rem, reset_, wait
    local x = CP and CP[i]
    if x then
      local cr, cc = CO[x], 0
      if rk > 0 then cc = rk end
      u, rem, reset_, wait = pairStanding(i, nw + x, limit, period, g, n, unit, cr.g, cr.n, cr.unit, counted, cc, not admit)
    else
      u, rem, reset_, wait = standing(i, limit, period, g, n, unit, counted, not admit)
    end
    if wait > rt then rt = wait end
    RES[m + 1], RES[m + 2] = u, reset_
    m = m + 2
  end
  if not admit then
    for j = 1, ntx do
      local tr = TX[j]
      local u, rem, reset_, wait
      if tr[8] > 0 then
        u, rem, reset_, wait = pairStanding(tb + j, -j, tr[2], tr[3], tr[4], tr[5], tr[6], tr[9], tr[10], tr[11], 0, 0, true)
      else
        u, rem, reset_, wait = standing(tb + j, tr[2], tr[3], tr[4], tr[5], tr[6], 0, true)
      end
      if wait > rt then rt = wait end
    end
  end
  for i = 1, nc do
    local o = co + 1 + 6 * (i - 1)
    local u, rem, reset_ = standing(cb + i, V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4], cAdm, false)
    RES[m + 1], RES[m + 2] = u, reset_
    m = m + 2
  end
  if banned then
    RES[1], RES[2] = 2, banUntil - now
    if rt > RES[2] then RES[2] = rt end
  elseif not admit then
    RES[1], RES[2] = 1, rt
  end
  if admitted and not banned and granted == 1 and rk == 0 and nc == 0 then
    -- The short form: one admission, no candidate windows; bare with
    -- nothing of a ban rule to report.
    if not R then return pack_(pl.bfmt, now, unpack(RES, 6, m)) end
    if RES[7] == 0 and RES[8] == 0 and RES[9] == 0 then return pack_(pl.bfmt, now, unpack(RES, 10, m)) end
    return pack_(pl.sfmt, now, unpack(RES, 7, m))
  end
  return pack_(pl.rfmt, unpack(RES, 1, m))
end

-- fast decides, as decide does, one request of the common plan: one to
-- three windows, a ban rule or none, no candidate windows, asked to decide,
-- with no strikes to count, no admissions to add and nothing to seed. It
-- makes the same reads, arithmetic and writes as decide, with its working
-- values in locals, the code of window and write written out in it for
-- each window (a Lua call and its arguments and results cost about a
-- tenth of a decision), and its reply packed at once. Where decide would
-- refuse (a banned key, a full window), it returns nil having written
-- nothing (its reads change nothing), and decide decides.
local function fast(base, pl, want, need, life, RSV)
  local V = pl.V
  local nw = V[1]
  -- The ban record, read first as decide reads it (most keys have none).
  local ban, bs, banUntil, offences, offenceAt, sring = pl.ban
  if ban then
    bs = call('GET', KEYS[base + 1])
    banUntil, offences, offenceAt, sring = banRead(bs, ban)
    if banUntil > now then return nil end
  end
  -- The windows, each read (takeLua) into locals of its own; room is
  -- what every window has left (no limit is near 2^53).
  local room, lend = 2 ^ 53, now + life
  local l1, period1, g1, n1, unit1, key1, h1, fresh1, vh1, total1, hc1, ho1, b1, c1, from1, cap1, cend1
  --@take(1)
  local l2, period2, g2, n2, unit2, key2, h2, fresh2, vh2, total2, hc2, ho2, b2, c2, from2, cap2, cend2
  if nw >= 2 then
    --@take(2)
  end
  local l3, period3, g3, n3, unit3, key3, h3, fresh3, vh3, total3, hc3, ho3, b3, c3, from3, cap3, cend3
  if nw == 3 then
    --@take(3)
  end
  -- Blocks (a plan whose one short window, window 1, has a coarse
  -- record: planAt): the window counts its coarse record's blocks too
  -- (cy) and is held to a cap on either record, read as decide reads it
  -- (view: working values y = nw + 1).
  -- m1: window 1's limit under a cap on either record.
  local y, cy, cr, m1 = nil, 0, nil, nil
  if pl.nco == 1 then
    cr, y = pl.CO[1], nw + 1
    local ck = KEYS[base + pl.kco + 1]
    view(y, ck, call('GETRANGE', ck, '0', '18'), period1, cr.g, cr.n, cr.unit)
    WCAP[y], WCEND[y] = readCap(ck, cr.n, cr.g, cr.unit, WB[y], WVH[y], WHC[y], WHO[y])
    cy, m1 = WUSED[y], l1
    if cap1 and cap1 < m1 then m1 = cap1 end
    if WCAP[y] and WCAP[y] < m1 then m1 = WCAP[y] end
    if c1 + cy >= m1 then return nil end
    if m1 - c1 - cy < room then room = m1 - c1 - cy end
  end
  local count, at = 1, now
  if want > 1 and room >= need and room >= want then count, at = want, lend else lend = 0 end
  -- A reservation riding on this admission (decide's, reserveSize): the
  -- long windows are window 3, or windows 2 and 3 (ns, the short ones,
  -- 1 or 2, fewer than nw).
  local leased, rk, rend, ns = count, 0, 0, 0
  if RSV then
    ns, rend = RSV[5], now + RSV[7]
    local sc, sp, lroom = c1 + 1, period1, 2 ^ 53
    if ns == 2 then
      sc, sp = c2 + 1, period2
    else
      local m = l2
      if cap2 and cap2 < m then m = cap2 end
      lroom = m - c2 - 1
      if (b2 + 1) * g2 < rend then rend = (b2 + 1) * g2 end
    end
    if nw == 3 then
      local m = l3
      if cap3 and cap3 < m then m = cap3 end
      if m - c3 - 1 < lroom then lroom = m - c3 - 1 end
      if (b3 + 1) * g3 < rend then rend = (b3 + 1) * g3 end
    end
    if y then
      -- A block (ns is 1: batch): window 1's room counts both records,
      -- and the block ends within the coarse bucket after the current
      -- (blockWrite).
      if m1 - c1 - cy - 1 < lroom then lroom = m1 - c1 - cy - 1 end
      local last = (floor(now / cr.g) + 2) * cr.g
      if last < rend then rend = last end
      sc = sc + cy
    end
    if ns == 2 then
      rk = reserveSize(sc, sp, lroom, rend - now, RSV, key2, g2, n2, vh2, total2, hc2, from2)
    else
      rk = reserveSize(sc, sp, lroom, rend - now, RSV, key1, g1, n1, vh1, total1, hc1, from1)
    end
  end
  local ttl1, off1 = pl.TTL[1]
  --@write(1)
  local reset1, reset2, reset3
  --@reset(1)
  if nw >= 2 then
    -- From here on the windows are long (count the reservation) when
    -- the first short ones are behind.
    if rk > 0 and ns == 1 then count, at = 1 + rk, rend end
    local ttl2, off2 = pl.TTL[2]
    --@write(2)
    --@reset(2)
  end
  if nw == 3 then
    if rk > 0 then count, at = 1 + rk, rend end
    local ttl3, off3 = pl.TTL[3]
    --@write(3)
    --@reset(3)
  end
  -- A lease caps every window until it ends; a reservation, every long
  -- window.
  if leased > 1 then
    --@capwrite(1)
    if nw >= 2 then
      --@capwrite(2)
    end
    if nw == 3 then
      --@capwrite(3)
    end
  elseif rk > 0 then
    lend = rend
    if ns == 1 then
      --@capwrite(2)
    end
    if nw == 3 then
      --@capwrite(3)
    end
  end
  if y then
    -- The block, in the coarse bucket of its end, capped there as every
    -- long window is; window 1's reply counts both records (decide's
    -- pairStanding, for an admission).
    local cc = 0
    if rk > 0 then
      cc = rk
      blockWrite(y, rk, rend, period1, cr.g, cr.n, cr.unit, cr.ttl)
      writeCap(WKEY[y], cr.n, l1, rend, WCAP[y], WCEND[y])
    end
    local r = newest(y, period1, cr.g, cr.n, cr.unit, cc)
    if r > reset1 then reset1 = r end
    c1 = c1 + cy + cc
  end
  -- With a ban rule, admitted with no strikes to count: what decide's
  -- strike reports then (the strikes the ring still counts, the offences
  -- remembered), with nothing written; all zero for a key with no ban
  -- record (most keys), as for a plan without a ban rule.
  local _, strikes, bu, off = nil, 0, 0, 0
  if bs then _, _, strikes, bu, off = strike(KEYS[base + 1], bs, ban, banUntil, offences, offenceAt, sring, 0, false) end
  -- The reply: for one admission (a cold key's) the bare form when the
  -- ban rule, if any, has nothing to report, else the short form; the
  -- whole form for a lease, or a reservation (its size and end in a
  -- lease's fields; per window the count with it, 1 + rk in the long
  -- ones: count's last value).
  if rk > 0 then
    local u2 = c2 + count
    if ns == 2 then u2 = c2 + 1 end
    if not ban then
      if nw == 2 then return pack_(pl.rfmt, 0, 0, now, 1 + rk, rend, c1 + 1, reset1, u2, reset2) end
      return pack_(pl.rfmt, 0, 0, now, 1 + rk, rend, c1 + 1, reset1, u2, reset2, c3 + count, reset3)
    end
    if nw == 2 then return pack_(pl.rfmt, 0, 0, now, 1 + rk, rend, 0, strikes, bu, off, c1 + 1, reset1, u2, reset2) end
    return pack_(pl.rfmt, 0, 0, now, 1 + rk, rend, 0, strikes, bu, off, c1 + 1, reset1, u2, reset2, c3 + count, reset3)
  end
  if count == 1 then
    if strikes == 0 and bu == 0 and off == 0 then
      if nw == 1 then return pack_(pl.bfmt, now, c1 + 1, reset1) end
      if nw == 2 then return pack_(pl.bfmt, now, c1 + 1, reset1, c2 + 1, reset2) end
      return pack_(pl.bfmt, now, c1 + 1, reset1, c2 + 1, reset2, c3 + 1, reset3)
    end
    if nw == 1 then return pack_(pl.sfmt, now, strikes, bu, off, c1 + 1, reset1) end
    if nw == 2 then return pack_(pl.sfmt, now, strikes, bu, off, c1 + 1, reset1, c2 + 1, reset2) end
    return pack_(pl.sfmt, now, strikes, bu, off, c1 + 1, reset1, c2 + 1, reset2, c3 + 1, reset3)
  end
  if not ban then
    if nw == 1 then return pack_(pl.rfmt, 0, 0, now, count, lend, c1 + count, reset1) end
    if nw == 2 then return pack_(pl.rfmt, 0, 0, now, count, lend, c1 + count, reset1, c2 + count, reset2) end
    return pack_(pl.rfmt, 0, 0, now, count, lend, c1 + count, reset1, c2 + count, reset2, c3 + count, reset3)
  end
  if nw == 1 then return pack_(pl.rfmt, 0, 0, now, count, lend, 0, strikes, bu, off, c1 + count, reset1) end
  if nw == 2 then return pack_(pl.rfmt, 0, 0, now, count, lend, 0, strikes, bu, off, c1 + count, reset1, c2 + count, reset2) end
  return pack_(pl.rfmt, 0, 0, now, count, lend, 0, strikes, bu, off, c1 + count, reset1, c2 + count, reset2, c3 + count, reset3)
end

-- PATHS counts the decisions the calls answered since the code loaded
-- and, of them, those that went to decide: tests read them to know which
-- path their decisions took (fast made the others). Counted once a call,
-- and once a decision only on decide's path.
local PATHS = {0, 0}

-- Plans are decoded once per call (once for all with a Function, up to
-- a bound): their numbers (V), where the ban rule, the candidate windows
-- and the candidate ban rule start in V, the ban rules as tables (nil: no
-- bans), the reply's format and the records' TTLs (ms). PLANS maps
-- a call's plan indexes, DECODED the plans' packed numbers.
local DECODED, ndecoded = {}, 0
local function banRule(V, o, mult)
  if V[o] == 0 then return nil, o + 1 end
  return {thr = V[o], sp = V[o + 1], sg = V[o + 2], sn = V[o + 3], su = V[o + 4], sttl = V[o + 5],
    memory = V[o + 6], base = V[o + 7], max = V[o + 8], mult = mult}, o + 9
end
local function planAt(PLANS, p)
  local pl = PLANS[p]
  if pl then return pl end
  local s, mult, cmult = ARGV[3 * p], ARGV[3 * p + 1], ARGV[3 * p + 2]
  pl = DECODED[s]
  if not pl or pl.mults ~= mult or pl.cmults ~= cmult then
    local V = {unpack_('>' .. rep('I8', #s / 8), s, 1)}
    local nw = V[1]
    local ban, co = banRule(V, 2 + 6 * nw, tonumber(mult))
    local nc = V[co]
    local cban, xo = banRule(V, co + 1 + 6 * nc, tonumber(cmult))
    -- Blocks: the coarse records of the short windows, when the plan has
    -- them (Go's plan.blocks): their count, then each as its window's
    -- index, period, bucket width, n, offset unit and TTL.
    local nco, CO, CP = 0, nil, nil
    -- (V's last value is unpack's next position, not a number of the
    -- plan's.)
    if xo <= #s / 8 then nco = V[xo] end
    if nco > 0 then
      CO, CP = {}, {}
      for x = 1, nco do
        local q = xo + 1 + 6 * (x - 1)
        CO[x] = {i = V[q], g = V[q + 2], n = V[q + 3], unit = V[q + 4], ttl = V[q + 5]}
        CP[V[q]] = x
      end
    end
    local ttl, cttl = {}, {}
    for i = 1, nw do ttl[i] = V[2 + 6 * (i - 1) + 5] end
    for i = 1, nc do cttl[i] = V[co + 1 + 6 * (i - 1) + 5] end
    local fields = 5 + 2 * (nw + nc)
    if ban then fields = fields + 4 end
    if nc > 0 then fields = fields + 4 end
    if cban then fields = fields + 4 end
    -- The short forms' fields: now, with a ban rule the strikes, ban end
    -- and offences (not in the bare form), then per window used and
    -- reset.
    pl = {V = V, co = co, ban = ban, cban = cban, rfmt = '>' .. rep('i8', fields), sfmt = '>' .. rep('i8', 4 + 2 * nw),
      bfmt = '>' .. rep('i8', 1 + 2 * nw), TTL = ttl, CTTL = cttl,
      mults = mult, cmults = cmult, fast = not cban and nc == 0 and nw <= 3 and (nco == 0 or nco == 1 and CO[1].i == 1),
      nco = nco, CO = CO, CP = CP, kco = 1 + nw + nc + (cban and 1 or 0)}
    if ndecoded >= 256 then DECODED, ndecoded = {}, 0 end
    DECODED[s], ndecoded = pl, ndecoded + 1
  end
  PLANS[p] = pl
  return pl
end

-- The call being decided: its decisions (ARGV[1]), where the next one's
-- numbers start, the KEYS index before its records, the replies so far
-- and the plans met (planAt).
local CALLS, POS, BASE, OUT, PLANS
local ADD = {}
-- A reservation's numbers (batch), one table for every decision: a table
-- a decision is work for the collector.
local RSVS = {}

-- batch makes the call's decisions from POS on, in order, each by fast
-- where it may (a plan fast serves, asked only to decide), else by
-- decide. It moves POS and BASE past a decision before making it, so that
-- when one fails (an error, which run catches), the batch goes on after
-- it.
local function batch()
  local calls, out = CALLS, OUT
  while POS <= #calls do
    local nk, p, na, pos = unpack_('>I8I8I8', calls, POS)
    local base = BASE
    POS, BASE = pos, base + nk
    local pl = planAt(PLANS, p)
    local mode, extra, want, need, life, r = 0, 0, 1, 1, 1
    -- fixed: how many of the numbers are the ask (the rest: adds, seeding).
    local fixed, RSV = 5
    if na == 0 then
      -- A plain request: to decide, with no strikes and no lease.
      if pl.fast then r = fast(base, pl, 1, 1, 1) end
    else
      mode, extra, want, need, life, pos = unpack_('>I8I8I8I8I8', calls, pos)
      if mode == 2 then
        -- Asked to decide, and to reserve (reserveSize): the replicas, the
        -- margin, the least worth granting, the round trips' allowance
        -- and how many of the plan's windows are short follow; want and
        -- life are the reservation's most and life, not a lease's.
        RSV = RSVS
        RSV[1], RSV[2], RSV[3], RSV[4], RSV[5], pos = unpack_('>I8I8I8I8I8', calls, pos)
        RSV[6], RSV[7] = want, life
        -- (Every window short: a block alone, where every short window
        -- has a coarse record.)
        if RSV[5] < 1 or RSV[5] > pl.V[1] or RSV[5] == pl.V[1] and pl.nco ~= RSV[5] then RSV = nil end
        want, need, life, fixed = 1, 1, 1, 10
      end
      POS = pos + 8 * (na - fixed)
      -- (With blocks, a reservation of other short windows than the
      -- coarse records' is decide's to refuse, and a block of a plan
      -- with no long window decide's to grant.)
      if pl.fast and mode ~= 1 and na == fixed and (extra == 0 or not pl.ban) and (not RSV or (pl.nco == 0 or RSV[5] == pl.nco) and RSV[5] < pl.V[1]) then
        r = fast(base, pl, want, need, life, RSV)
      end
    end
    if not r then
      PATHS[2] = PATHS[2] + 1
      local nw = pl.V[1]
      -- The admissions to add per window are sent only when there are
      -- any (or seeding numbers follow them).
      if na > fixed then
        for i = 1, nw do ADD[i], pos = unpack_('>I8', calls, pos) end
      else
        for i = 1, nw do ADD[i] = 0 end
      end
      local SEED
      if na > fixed + nw then
        SEED = {unpack_('>' .. rep('I8', na - fixed - nw), calls, pos)}
        SEED[na - fixed - nw + 1] = nil
      end
      r = decide(base, pl, mode, extra, want, need, life, ADD, SEED, RSV)
    end
    out[#out + 1] = r
  end
end

-- run decides the batch of a call, at one reading of the server's clock:
-- its decisions happen at one instant, in order. A decision that fails
-- replies "E" and the error; the others are made as if it were not
-- there. (One pcall for the batch, not one per decision: a decision that
-- fails is rare, and a pcall's setup is not free.)
local function run(keys, args)
  if not byte then init() end
  KEYS, ARGV = keys, args
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  CALLS, POS, BASE, OUT, PLANS = ARGV[1], 1, 0, {}, {}
  FIN = tonumber(ARGV[2]) or 0
  NOWMS = floor(now / 1000)
  while true do
    local from = POS
    local ok, err = pcall(batch)
    if ok then break end
    -- A failure before a decision's numbers were read is the call's own
    -- (malformed numbers): it ends the call.
    if POS == from then error(err) end
    if type(err) == 'table' and err.err then err = err.err end
    OUT[#OUT + 1] = 'E' .. tostring(err)
  end
  PATHS[1] = PATHS[1] + #OUT
  return OUT
end
`)

// The code of window, write and resetAt (in decideCore), written once
// here and put in twice: as the bodies of the functions decide calls, and
// written out in fast for each of its windows, where the calls would cost
// about a tenth of a decision (BenchmarkLuaLineProfile). "$" stands for the
// window's suffix in fast ("1", "2"; "" in the functions): its inputs
// key$, h$, period$, g$, n$, unit$ (window); key$, h$, fresh$, vh$, total$,
// hc$, ho$, b$, g$, n$, unit$, ttl$, count, at (write); b$, off$, period$,
// g$, n$, unit$ (reset); its outputs, declared before, fresh$, vh$,
// total$, hc$, ho$, b$, c$, from$ (window), off$ (write; hc$ and ho$ are
// then the head's before the events, 0 when it moved) and reset$ (reset).
// Names local to a body (lo, s, R, d, hdr, ...) stay inside its do-block.
// expandLua puts them where the code says --@window(suffix),
// --@write(suffix) or --@reset(suffix).
const windowLua = `do
  fresh$ = #h$ < 1 + HDR
  if fresh$ then vh$, total$, hc$, ho$ = 0, 0, 0, 0 else vh$, total$, hc$, ho$ = unpack_(RINGFMT, h$, 2) end
  b$ = (now - now % g$) / g$
  if b$ < vh$ then b$ = vh$ end
  c$, from$ = total$, b$ - n$
  if total$ > 0 then
    if b$ - vh$ > n$ then
      -- Every bucket it had has slid out.
      total$, c$ = 0, 0
    elseif total$ == hc$ and hc$ < MAXC then
      -- Every event is in the head bucket (no count saturated, so every
      -- other slot holds zero): nothing else can leave, and the head
      -- bucket's count and offset are in the header. No slot to read: a
      -- key's first burst in a period, say, lands here.
      if b$ - n$ == vh$ and (b$ - n$) * g$ + ho$ * unit$ + period$ <= now then c$, from$ = 0, b$ - n$ + 1 end
    else
      local lo, hi = b$ - n$, b$ - n$
      if b$ > vh$ then lo = vh$ - n$ end
      local si, k = lo % (n$ + 1), hi - lo + 1
      local s, R
      if si + k > n$ + 1 then
        -- The run wraps: read the whole ring.
        s, R = call('GETRANGE', key$, OFF[1 + HDR], OFF[HDR + (n$ + 1) * SLOT]), 1
        total$ = advanced(s, R, n$, vh$, total$, b$)
      else
        -- The k - 1 slots leaving, then the oldest (advanced, in short).
        s, R = call('GETRANGE', key$, OFF[1 + HDR + si * SLOT], OFF[HDR + (si + k) * SLOT]), 1 - si * SLOT
        if k > 1 then
          total$ = total$ - counts(s, 1, 0, k - 2)
          if total$ < 0 then total$ = 0 end
        end
      end
      c$ = total$
      -- The oldest bucket leaves as soon as its last event is a full
      -- period old.
      local j0 = b$ - n$
      if total$ > 0 and j0 <= vh$ then
        local c0, l0 = hc$, ho$
        if j0 < vh$ then c0, l0 = unpack_('>I4I2', s, R + (j0 % (n$ + 1)) * SLOT) end
        if c0 > 0 and j0 * g$ + l0 * unit$ + period$ <= now then c$, from$ = total$ - c0, j0 + 1 end
      end
    end
  end
end
`

const writeLua = `do
  if b$ > vh$ then
    if fresh$ then
      -- Written whole below.
    elseif b$ - vh$ <= 8 and b$ - vh$ <= n$ and vh$ % (n$ + 1) + b$ - vh$ <= n$ + 1 then
      -- The common move, a few buckets with no wrap: the old head's slot
      -- and zeros over the skipped ones, in one write (move, in short).
      -- The old head's count and offset are the header's own bytes (as
      -- read: hc$ and ho$ have not changed), cut rather than packed.
      local x = sub(h$, 14, 19)
      if b$ - vh$ > 1 then x = x .. zeros((b$ - vh$ - 1) * SLOT) end
      call('SETRANGE', key$, OFF[1 + HDR + (vh$ % (n$ + 1)) * SLOT], x)
    else
      for q = 1, 2 * move(n$, vh$, hc$, ho$, b$), 2 do call('SETRANGE', key$, OFF[HDR + MV[q]], MV[q + 1]) end
    end
    hc$, ho$ = 0, 0
  end
  -- The offset of at in its bucket, in units, rounded up.
  local d = at - b$ * g$
  off$ = 0
  if d > 0 then off$ = (d + unit$ - 1 - (d + unit$ - 1) % unit$) / unit$ end
  if hc$ > 0 and ho$ > off$ then off$ = ho$ end
  local hdr = pack_(RINGFMT, b$, total$ + count, hc$ + count, off$)
  if fresh$ then
    call('SET', key$, blank(n$), 'PX', itoa(expiry(b$, g$, n$, ttl$) - NOWMS))
    call('SETRANGE', key$, '1', hdr)
  else
    call('SETRANGE', key$, '1', hdr)
    if b$ > vh$ then
      -- The expiry (expiry, written out): set unless finalized and the
      -- head stays in an epoch that began after FIN.
      local E = (n$ - n$ % 4) / 4
      if E < 1 then E = 1 end
      local e0 = b$ - b$ % E
      if FIN == 0 or vh$ < e0 or e0 * g$ < FIN then
        local x = ceil((e0 + E) * g$ / 1000) + ttl$ - NOWMS
        if x ~= EXPX then EXPX, EXPS = x, format('%d', x) end
        call('PEXPIRE', key$, EXPS)
      end
    end
  end
end
`

// takeLua is fast's reading of its window $ (1-based): its numbers from
// the plan (window $ starts at V[6$ - 4]; Lua folds the constants), its
// header and the slots it needs (windowLua), then the request's fit:
// fast hands a full window to decide, and room and lend become what
// every window read so far allows.
const takeLua = `do
  l$, period$, g$, n$, unit$, key$ = V[6 * $ - 4], V[6 * $ - 3], V[6 * $ - 2], V[6 * $ - 1], V[6 * $], KEYS[base + 1 + $]
  h$ = call('GETRANGE', key$, '0', '18')
  --@window($)
  -- A lease still being spent on this window caps this request too.
  --@capread($)
  local m = l$
  if cap$ and cap$ < m then m = cap$ end
  if c$ >= m then return nil end
  if m - c$ < room then room = m - c$ end
  if (b$ + 1) * g$ < lend then lend = (b$ + 1) * g$ end
end
`

// capReadLua reads window $'s lease cap into cap$ and cend$, left nil
// when none is in force: only while a lease may still be spent (its head
// bucket is the current one, holds two events or more, and its last
// event, where a lease's end is recorded, lies ahead). Its inputs: key$,
// n$, g$, unit$ and the window's b$, vh$, hc$, ho$ (windowLua).
const capReadLua = `if b$ == vh$ and hc$ > 1 and vh$ * g$ + ho$ * unit$ > now then
  local o = capAt(n$)
  local s = call('GETRANGE', key$, OFF[o], OFF[o + CAPLEN - 1])
  if #s >= CAPLEN then
    local cp, ce = unpack_(CAPFMT, s, 1)
    if ce > now then cap$, cend$ = cp, ce end
  end
end
`

// capWriteLua records the lease just granted (ending at lend) under
// window $'s limit l$ in its cap: the lower of l$ and a cap in force
// (cap$, cend$ as read), until the later end; a cap in force that already
// covers the lease (a busy key's next lease, ending with the same bucket)
// stays as it is.
const capWriteLua = `if not (cend$ and cap$ <= l$ and cend$ >= lend) then
  local cp, ce = l$, lend
  if cend$ then
    if cap$ < cp then cp = cap$ end
    if cend$ > ce then ce = cend$ end
  end
  call('SETRANGE', key$, OFF[capAt(n$)], pack_(CAPFMT, cp, ce))
end
`

const resetLua = `reset$ = b$ * g$ + off$ * unit$ + period$
if reset$ < (b$ + n$) * g$ then reset$ = (b$ + n$) * g$ end
if reset$ > (b$ + n$ + 1) * g$ then reset$ = (b$ + n$ + 1) * g$ end
`

// expandLua returns src with windowLua, writeLua, resetLua, takeLua,
// capReadLua and capWriteLua put where it says --@window(suffix),
// --@write(suffix), --@reset(suffix), --@take(suffix), --@capread(suffix)
// and --@capwrite(suffix) on a line of its own. src is this package's own constant: a marker it does not know, or
// a "$" left over, is a mistake in this file, and panics when the package
// loads, so that no test runs code with a part missing.
func expandLua(src string) string {
	bodies := map[string]string{"window": windowLua, "write": writeLua, "reset": resetLua, "take": takeLua,
		"capread": capReadLua, "capwrite": capWriteLua}
	var b strings.Builder
	for line := range strings.Lines(src) {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, "--@") {
			b.WriteString(line)
			continue
		}
		name, sfx, ok := strings.Cut(strings.TrimPrefix(t, "--@"), "(")
		body, known := bodies[name]
		if !ok || !known || !strings.HasSuffix(sfx, ")") {
			panic("ratelimit: unknown marker in the decision code: " + t)
		}
		// A body may hold markers of its own (take holds window's).
		b.WriteString(expandLua(strings.ReplaceAll(body, "$", strings.TrimSuffix(sfx, ")"))))
	}
	if strings.Contains(b.String(), "$") {
		panic("ratelimit: a \"$\" left in the decision code")
	}
	return b.String()
}

// decideLua is decideCore as a script (EVAL, EVALSHA): KEYS and ARGV are
// the script's globals.
var decideLua = decideCore + `
return run(_G.KEYS, _G.ARGV)
`

// decideLibrary returns decideCore as a Redis Function library (FUNCTION
// LOAD, FCALL) named lib, registering the function fn. Its code runs
// once, at load: every call then finds its helpers (and the plans and
// offsets it has decoded) ready, where a script re-creates them on every
// call; that is most of what a call costs when it decides few requests.
func decideLibrary(lib, fn string) string {
	return "#!lua name=" + lib + "\n" + decideCore + `
redis.register_function('` + fn + `', function(keys, args) return run(keys, args) end)
`
}

// codecLua binds unpack_ and pack_: big-endian unsigned integers of the
// given byte widths (">I6I2I3"), read from string s at position p (the
// values, then the position after them) or packed into one string. Redis
// has them in C (the struct library, several times faster than decoding
// byte by byte in Lua); elsewhere (miniredis in tests) the same functions
// are written in Lua, for the formats used here: '>' then 'I' with a
// width of 1 to 8. TestCodecMatchesStruct checks that they agree.
const codecLua = `
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

// script is the decision code in both forms: as a script (decideLua and
// its SHA1, for EVALSHA) and as a Function library (its source, and the
// library's and the function's names, for FUNCTION LOAD and FCALL). The
// names carry a digest of the code, so releases whose code differs load
// libraries of their own side by side and never replace each other's.
type script struct {
	src, sha    string
	library, fn string
}

// decisionScript returns the decision code.
func decisionScript() script {
	sum := sha1.Sum([]byte(decideLua))
	sha := hex.EncodeToString(sum[:])
	core := sha1.Sum([]byte(decideCore))
	name := "petstore_ratelimit_" + hex.EncodeToString(core[:8])
	return script{src: decideLua, sha: sha, library: decideLibrary(name, name+"_decide"), fn: name + "_decide"}
}
