package ratelimit

import (
	"crypto/sha1"
	"encoding/hex"
)

// decideLua decides a batch of requests atomically on the Redis server,
// in order, at one reading of the server's clock: for each, the same
// algorithm as keyState.decide (state.go), on the records format.go
// describes. One call of the script serves every decision of a pipeline
// flush (of one Redis Cluster slot), so the call's fixed costs (TIME, Lua
// call setup, command dispatch, decoding each plan's numbers) are paid
// once per batch, not per decision.
//
// Each decision reads all of its key's records with one MGET (window
// records whole: the slots a decision needs come with them), writes only
// the bytes that change (SETRANGE), and refreshes a record's TTL when its
// head moves; strikes rewrite the small ban record with its TTL. No key is
// ever left without a TTL. Decisions of one batch for the same key see
// each other's writes, in the batch's order.
//
// KEYS: each decision's records, one decision after the other: the ban
// record, the window records in the plan's order, the candidate window
// records, then the records of other periods it may take its past from
// or must also fit (seeding, registry.go). All of one decision's records
// share its key's hash slot; in Redis Cluster a batch holds one slot.
//
// ARGV[1]: the decisions, 8-byte big-endian numbers each: how many KEYS
// it has, its plan (index among the plans below, from 1), how many
// numbers follow, then those: mode (0 decide, 1 peek), extra strikes,
// lease size wanted, lease room needed, lease life (µs), per window the
// admissions made without Redis to record (input.add), and, when a plan
// edit changed periods, the seeding numbers (seeding.nums). ARGV[2p],
// ARGV[2p+1]: plan p's numbers packed (window count, ban threshold (0: no
// bans), per window limit, period, bucket width, n, offset unit (µs) and
// record TTL (ms); with bans the strike window's period, bucket width, n,
// offset unit and TTL, the offence memory, the ban's base and max (µs);
// the candidate window count and per candidate window the same six as a
// window) and its ban multiplier.
//
// Leases: an admission counts want admissions at once (a lease) when every
// window has at least need (>= want) remaining; they count in the current
// bucket of every window and may be spent until the lease ends: the end of
// the current bucket of every window, and at most life after now. The
// lease's end is recorded as the bucket's last event, and that time only
// ever grows. Otherwise one admission counts.
//
// Reply: one string per decision, in order. A decision's string is 8-byte
// big-endian signed integers (decode reads it): outcome, retry, now, new
// ban, strikes, ban end, offences, admissions granted, lease end, whether
// the candidate windows admit this request, and how many requests they
// admitted and limited, then per window used, remaining, reset, then the
// same per candidate window. Times in µs. A decision that failed (a
// record of another type, say) is "E" and the error, and does not stop
// the others.
const decideLua = `
local byte, char, sub, rep, floor, ceil = string.byte, string.char, string.sub, string.rep, math.floor, math.ceil
` + codecLua + `
-- Record layout (format.go): a ring is a header of head (8), total (4),
-- head count (4) and head offset (2) bytes, then n+1 slots of count (4)
-- and offset (2). A window record is a version byte and a ring; a ban
-- record is version, ban end, offences, last offence, strike period and
-- strike bucket width (1+8+4+8+8+8 bytes), then the strike ring.
local VERSION, HDR, SLOT, MAXC = 1, 18, 6, 4294967295
local RINGFMT = '>I8I4I4I2'
-- A window record's slots start here (1-based).
local WR = 2 + HDR

-- get reads a k-byte big-endian integer at position p of s.
local function get(s, p, k)
  local v = 0
  for i = p, p + k - 1 do v = v * 256 + byte(s, i) end
  return v
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

-- untl is when bucket j (last event at l) stops counting.
local function untl(j, l, period, n, g)
  local t = l + period
  local lo, hi = (j + n) * g, (j + n + 1) * g
  if t < lo then t = lo end
  if t > hi then t = hi end
  return t
end

-- advanced returns the total once the head moves from vh to b.
local function advanced(s, R, n, vh, total, b)
  if b <= vh or total <= 0 then return total end
  if b - vh > n then return 0 end
  for j = vh - n, b - n - 1 do total = total - get(s, R + (j % (n + 1)) * SLOT, 4) end
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

-- move returns (position, bytes) for the slot writes needed when the head
-- moves from vh to b: the old head bucket's count and offset (when it
-- stays in the ring) and zeros over the stale slots of the buckets
-- skipped. These slots are consecutive: one write, two when the ring
-- wraps. Positions are 1-based within the ring's slots.
local function move(n, vh, hc, ho, b)
  local lo, x = b - n, ''
  if vh >= lo then
    lo = vh
    x = pack_('>I4I2', hc, ho)
  end
  local k = b - lo
  if k <= 0 then return end
  x = x .. rep('\0', k * SLOT - #x)
  local i = lo % (n + 1)
  if i + k <= n + 1 then return 1 + i * SLOT, x end
  local first = (n + 1 - i) * SLOT
  return 1 + i * SLOT, sub(x, 1, first), 1, sub(x, first + 1)
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

-- seed writes the record key of a window (period, g, n, unit, ttl) that
-- the key has none of yet, from ss, the key's record of another period
-- (sp, sg, sn, su), with its head at b: every bucket of ss whose last
-- event still counts in the window at now is carried over whole, at that
-- event's time (or into the oldest bucket kept). It returns the record it
-- wrote, or nil when there was nothing to carry. ringState.seedFrom
-- (state.go) is the same in Go.
local function seed(key, ss, sp, sg, sn, su, period, g, n, unit, ttl, b, now)
  local svh, stot, shc, sho = unpack_(RINGFMT, ss, 2)
  if stot <= 0 then return nil end
  local cs, os, total = {}, {}, 0
  for j = svh - sn, svh do
    local c = cnt(ss, WR, sn, svh, shc, j)
    if c > 0 then
      local t = lastAt(ss, WR, sn, sg, su, svh, sho, j)
      if t + period > now then
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
  if total <= 0 then return nil end
  if total > MAXC then total = MAXC end
  local slots = {}
  for i = 1, n + 1 do slots[i] = '\0\0\0\0\0\0' end
  for a, c in pairs(cs) do
    if a > 0 then slots[((b - a) % (n + 1)) + 1] = pack_('>I4I2', c, os[a]) end
  end
  local rec = char(VERSION) .. pack_(RINGFMT, b, total, cs[0] or 0, os[0] or 0) .. table.concat(slots)
  redis.call('SET', key, rec, 'PX', ttl)
  return rec
end

-- One clock reading for the whole batch: its decisions happen at one
-- instant, in order.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- view returns window working values for record key, whose content is s
-- (false or nil: none), at now: its head, total and the events it counts.
local function view(key, s, period, g, n, unit)
  local fresh = not s or #s < 1 + HDR
  local vh, total, hc, ho = 0, 0, 0, 0
  if fresh then s = '' else vh, total, hc, ho = unpack_(RINGFMT, s, 2) end
  local b = floor(now / g)
  if b < vh then b = vh end
  local tot = advanced(s, WR, n, vh, total, b)
  local c, from = tot, b - n
  if tot > 0 then c, from = used(s, WR, n, g, unit, period, vh, hc, ho, tot, now, b) end
  return {key = key, s = s, fresh = fresh, vh = vh, total = tot, hc = hc, ho = ho, b = b, used = c, from = from, add = 0}
end

-- record counts k events at time t in the current bucket of window x:
-- one header write (and the slots the head leaves behind when it moves,
-- with a TTL refresh), or the whole record when it is new.
local function record(x, k, t, g, n, unit, ttl)
  local hc, ho = x.hc, x.ho
  if x.b > x.vh then
    if not x.fresh then
      local p1, x1, p2, x2 = move(n, x.vh, hc, ho, x.b)
      if p1 then redis.call('SETRANGE', x.key, HDR + p1, x1) end
      if p2 then redis.call('SETRANGE', x.key, HDR + p2, x2) end
    end
    hc, ho = 0, 0
  end
  local off = ceil((t - x.b * g) / unit)
  if off < 0 then off = 0 end
  if hc > 0 and ho > off then off = ho end
  local hdr = pack_(RINGFMT, x.b, x.total + k, hc + k, off)
  if x.fresh then
    x.s = char(VERSION) .. hdr .. rep('\0', (n + 1) * SLOT)
    redis.call('SET', x.key, x.s, 'PX', ttl)
  else
    redis.call('SETRANGE', x.key, 1, hdr)
    if x.b > x.vh then redis.call('PEXPIRE', x.key, ttl) end
    -- x.s no longer holds the record; a scan below reads it again.
    x.dirty = true
  end
  x.fresh, x.vh, x.hc, x.ho, x.total = false, x.b, hc + k, off, x.total + k
end

-- standing returns window x's used, remaining and reset after the
-- decision, and (for a refused request whose window is full) how long
-- until the window admits one more.
local function standing(x, limit, period, g, n, unit, counted, refused)
  local u, reset_, wait = x.used, now, 0
  if counted > 0 then
    u = u + counted
    reset_ = untl(x.b, x.b * g + x.ho * unit, period, n, g)
  elseif u > 0 then
    local s = x.s
    if x.dirty then s = redis.call('GET', x.key) end
    reset_ = scan(s, WR, n, g, unit, period, x.vh, x.hc, x.ho, x.from, x.b, 0, now)
    if refused and u >= limit then
      wait = scan(s, WR, n, g, unit, period, x.vh, x.hc, x.ho, x.from, x.b, u - limit + 1, now) - now
    end
  end
  local rem = limit - u
  if rem < 0 then rem = 0 end
  return u, rem, reset_, wait
end

-- decide evaluates one decision whose records are KEYS[base + 1 ..
-- base + nk], under the plan whose numbers are V (ban multiplier mult,
-- reply format rfmt), asked A (the per-decision numbers), and returns its
-- reply.
local function decide(base, nk, V, mult, rfmt, A)
  local nw, thr = V[1], V[2]
  -- Every record of the key, read at once: REC[i] is KEYS[base + i]'s
  -- content (false: none), as this decision left it, unless it wrote
  -- part of it (dirty).
  local REC = redis.call('MGET', unpack(KEYS, base + 1, base + nk))

  -- After a plan changed its periods: where a window the key has no
  -- record of may take its past from (the number of sources, each as
  -- (KEYS index, period, g, n, unit), then per window the number of
  -- sources to try, in order, and their indexes), then the transition
  -- windows, enforced beside the plan's own where the key has a record of
  -- them (another plan's windows, while an edit spreads over the
  -- replicas): their number, each as (KEYS index, limit, period, g, n,
  -- unit, ttl).
  local mode, extra, want, need, life = A[1], A[2], A[3], A[4], A[5]
  local SRC, TRY, TRANS = {}, {}, {}
  if #A > 5 + nw then
    local o = 6 + nw
    local ns = A[o]
    for s = 1, ns do
      local q = o + 1 + 5 * (s - 1)
      SRC[s] = {A[q], A[q + 1], A[q + 2], A[q + 3], A[q + 4]}
    end
    o = o + 1 + 5 * ns
    for i = 1, nw do
      local k = A[o]
      TRY[i] = {}
      for m = 1, k do TRY[i][m] = A[o + m] end
      o = o + 1 + k
    end
    for j = 1, A[o] do
      local q = o + 1 + 7 * (j - 1)
      TRANS[j] = {A[q], A[q + 1], A[q + 2], A[q + 3], A[q + 4], A[q + 5], A[q + 6]}
    end
  end
  local peek = mode == 1

  -- The ban record.
  local ban = thr > 0
  local banUntil, offences, offenceAt = 0, 0, 0
  local bs, sring = false, false
  local sp, sg, sn, su, sttl, memory, banBase, banMax
  if ban then
    local o = 3 + 6 * nw
    sp, sg, sn, su, sttl, memory, banBase, banMax = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4], V[o + 5], V[o + 6], V[o + 7]
    bs = REC[1]
    if bs and #bs >= 37 then
      banUntil, offences, offenceAt = get(bs, 2, 8), get(bs, 10, 4), get(bs, 14, 8)
      if offences > 0 and offenceAt + memory <= now then offences = 0 end
      -- Strikes of another strike window do not count toward this one.
      sring = get(bs, 22, 8) == sp and get(bs, 30, 8) == sg and #bs >= 37 + HDR + (sn + 1) * SLOT
    else
      bs = false
    end
  end
  local banned = ban and banUntil > now
  local admit = not banned
  local room, lend = -1, now + life

  -- Windows: X holds per window its view and working values.
  local X = {}
  for i = 1, nw do
    local o = 3 + 6 * (i - 1)
    local limit, period, g, n, unit = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4]
    local key = KEYS[base + 1 + i]
    local s = REC[1 + i]
    if (not s or #s < 1 + HDR) and TRY[i] then
      -- A period the key has no record of, after a plan edit: start from
      -- the best record of another period the key has.
      for _, si in ipairs(TRY[i]) do
        local src = SRC[si]
        local ss = REC[src[1]]
        if ss and #ss >= 1 + HDR + (src[4] + 1) * SLOT then
          local w = seed(key, ss, src[2], src[3], src[4], src[5], period, g, n, unit, V[o + 5], floor(now / g), now)
          if w then
            s = w
            REC[1 + i] = w
          end
          break
        end
      end
    end
    local x = view(key, s, period, g, n, unit)
    -- Admissions made locally while Redis was unreachable count first, as
    -- made now: at most the window's limit, since no interval held more.
    local add = A[5 + i]
    if add > 0 and not peek then
      x.add = add
      if x.add > limit then x.add = limit end
      x.used = x.used + x.add
    end
    X[i] = x
    local c = x.used
    if c >= limit then admit = false end
    if room < 0 or limit - c < room then room = limit - c end
    if (x.b + 1) * g < lend then lend = (x.b + 1) * g end
  end

  -- Transition windows: another plan's windows, while an edit spreads.
  -- Where the key has a record of one, an admission here must fit it too
  -- and counts in it, so replicas still on that plan see it.
  local TX = {}
  for j = 1, #TRANS do
    local tr = TRANS[j]
    local s = REC[tr[1]]
    if s and #s >= 1 + HDR then
      local x = view(KEYS[base + tr[1]], s, tr[3], tr[4], tr[5], tr[6])
      TX[#TX + 1] = {x = x, tr = tr}
      if x.used >= tr[2] then admit = false end
      if room < 0 or tr[2] - x.used < room then room = tr[2] - x.used end
      if (x.b + 1) * tr[4] < lend then lend = (x.b + 1) * tr[4] end
    end
  end

  -- granted admissions count at once; at is the time recorded for them.
  local granted, at = 1, now
  if want > 1 and room >= need and room >= want then granted, at = want, lend else lend = 0 end
  local admitted = admit and not peek

  for i = 1, nw do
    local x = X[i]
    local k, t = x.add, now
    if admitted then k, t = k + granted, at end
    if k > 0 then
      local o = 3 + 6 * (i - 1)
      record(x, k, t, V[o + 2], V[o + 3], V[o + 4], V[o + 5])
    end
  end
  if admitted then
    for _, tx in ipairs(TX) do
      local tr = tx.tr
      record(tx.x, granted, at, tr[4], tr[5], tr[6], tr[7])
    end
  end

  -- Candidate windows: evaluated on every request that reaches the script
  -- (this one, and the extra rejections answered locally since the last
  -- round trip), never refusing one. Each request they would admit, they
  -- count, as if they were the only windows; the rest they would have
  -- limited. Records of their own, so that a candidate never touches an
  -- enforced window's count.
  local co = 3 + 6 * nw
  if ban then co = co + 8 end
  local nc = V[co]
  local CX, croom = {}, -1
  for i = 1, nc do
    local o = co + 1 + 6 * (i - 1)
    local limit, period, g, n, unit = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4]
    local x = view(KEYS[base + 1 + nw + i], REC[1 + nw + i], period, g, n, unit)
    CX[i] = x
    if croom < 0 or limit - x.used < croom then croom = limit - x.used end
  end
  -- cAdm, cLim: requests the candidate windows would admit, would limit;
  -- cThis: whether they would admit this one (the extras came before it).
  local cAdm, cLim, cThis = 0, 0, 0
  if nc > 0 and not peek then
    local k = 1 + extra
    if croom < 0 then croom = 0 end
    cAdm = k
    if cAdm > croom then cAdm = croom end
    cLim = k - cAdm
    if croom > extra then cThis = 1 end
    if cAdm > 0 then
      for i = 1, nc do
        local o = co + 1 + 6 * (i - 1)
        record(CX[i], cAdm, now, V[o + 2], V[o + 3], V[o + 4], V[o + 5])
      end
    end
  end

  -- Strikes: this rejection and those answered locally since the last
  -- round trip (extra), unless the key is banned.
  local newBan, strikes = 0, 0
  if ban then
    local k = extra
    if not admit and not banned then k = k + 1 end
    local write = not peek and not banned and k > 0
    if write or sring then
      if not sring then
        -- A new strike ring (of this strike window's geometry).
        bs = pack_('>I1I8I4I8I8I8', VERSION, banUntil, offences, offenceAt, sp, sg) .. rep('\0', HDR + (sn + 1) * SLOT)
      end
      local R = 38 + HDR
      local vh, total, hc, ho = unpack_(RINGFMT, bs, 38)
      local b = floor(now / sg)
      if b < vh then b = vh end
      total = advanced(bs, R, sn, vh, total, b)
      if write then
        if b > vh then
          local p1, x1, p2, x2 = move(sn, vh, hc, ho, b)
          if p1 then bs = sub(bs, 1, R + p1 - 2) .. x1 .. sub(bs, R + p1 - 1 + #x1) end
          if p2 then bs = sub(bs, 1, R + p2 - 2) .. x2 .. sub(bs, R + p2 - 1 + #x2) end
          hc = 0
        end
        hc = hc + k
        if hc > MAXC then hc = MAXC end
        total = total + k
        if total > MAXC then total = MAXC end
        local off = ceil((now - b * sg) / su)
        if off < 0 then off = 0 end
        if hc > k and ho > off then off = ho end
        ho, vh = off, b
        if used(bs, R, sn, sg, su, sp, vh, hc, ho, total, now, b) > thr then
          offences = offences + 1
          if offences > MAXC then offences = MAXC end
          offenceAt = now
          -- The ban's length is plan.banLength: base*mult^(offences-1), capped.
          local d, cap = banBase, 2 ^ 50
          if banMax > 0 then cap = banMax end
          local j = 1
          while j < offences and d < cap and mult > 1 do
            d = d * mult
            j = j + 1
          end
          if d > cap then d = cap end
          d = floor(d)
          if d < 1 then d = 1 end
          banUntil = now + d
          total, hc, ho = 0, 0, 0
          bs = sub(bs, 1, R - 1) .. rep('\0', (sn + 1) * SLOT)
          banned, newBan = true, 1
        end
        bs = pack_('>I1I8I4I8I8I8', VERSION, banUntil, offences, offenceAt, sp, sg) .. pack_(RINGFMT, vh, total, hc, ho) .. sub(bs, R)
        local e = banUntil
        if offenceAt + memory > e then e = offenceAt + memory end
        if now + sttl * 1000 > e then e = now + sttl * 1000 end
        redis.call('SET', KEYS[base + 1], bs, 'PX', ceil((e - now) / 1000) + 1)
      end
      strikes = used(bs, R, sn, sg, su, sp, vh, hc, ho, total, now, b)
    end
    if banUntil <= now then banUntil = 0 end
  end

  if not admitted then granted, lend = 0, 0 end
  local rt = 0
  local res = {0, 0, now, newBan, strikes, banUntil, offences, granted, lend, cThis, cAdm, cLim}
  for i = 1, nw do
    local o = 3 + 6 * (i - 1)
    local limit, period, g, n, unit = V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4]
    local counted = 0
    if admitted then counted = granted end
    -- A refused request (banned or limited) waits for every full window
    -- as well as for the ban: Retry-After is the true wait.
    local u, rem, reset_, wait = standing(X[i], limit, period, g, n, unit, counted, not admit)
    if wait > rt then rt = wait end
    res[#res + 1], res[#res + 2], res[#res + 3] = u, rem, reset_
  end
  for _, tx in ipairs(TX) do
    local tr = tx.tr
    if not admit then
      local _, _, _, wait = standing(tx.x, tr[2], tr[3], tr[4], tr[5], tr[6], 0, true)
      if wait > rt then rt = wait end
    end
  end
  for i = 1, nc do
    local o = co + 1 + 6 * (i - 1)
    local u, rem, reset_ = standing(CX[i], V[o], V[o + 1], V[o + 2], V[o + 3], V[o + 4], cAdm, false)
    res[#res + 1], res[#res + 2], res[#res + 3] = u, rem, reset_
  end
  if banned then
    res[1], res[2] = 2, banUntil - now
    if rt > res[2] then res[2] = rt end
  elseif not admit then
    res[1], res[2] = 1, rt
  end
  return pack_(rfmt, unpack(res))
end

-- The batch: plans are decoded once each, on first use.
local PLANS = {}
local function planAt(p)
  local pl = PLANS[p]
  if not pl then
    local s = ARGV[2 * p]
    local V = {unpack_('>' .. rep('I8', #s / 8), s, 1)}
    local nw, nc = V[1], 0
    local co = 3 + 6 * nw
    if V[2] > 0 then co = co + 8 end
    nc = V[co]
    pl = {V = V, mult = tonumber(ARGV[2 * p + 1]), rfmt = '>' .. rep('i8', 12 + 3 * (nw + nc))}
    PLANS[p] = pl
  end
  return pl
end

local calls, pos, base = ARGV[1], 1, 0
local out = {}
while pos <= #calls do
  local nk, p, na
  nk, p, na, pos = unpack_('>I8I8I8', calls, pos)
  local A = {}
  if na > 0 then
    A = {unpack_('>' .. rep('I8', na), calls, pos)}
    pos = A[na + 1]
    A[na + 1] = nil
  end
  local pl = planAt(p)
  local ok, r = pcall(decide, base, nk, pl.V, pl.mult, pl.rfmt, A)
  if not ok then
    if type(r) == 'table' and r.err then r = r.err end
    r = 'E' .. tostring(r)
  end
  out[#out + 1] = r
  base = base + nk
end
return out
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
