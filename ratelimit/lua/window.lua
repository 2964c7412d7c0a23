-- Decision code (redisdecider.go): window records, their lease cap, their report.

-- Working values by window index (window's results, and WADD: admissions
-- added), reused so that a decision allocates almost nothing.
local WKEY, WH, WFRESH, WVH, WTOT, WHC, WHO, WB, WUSED, WFROM, WADD = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
-- CS[key]: compact record key as window read it in this call, until written.
local CS = {}

-- The lease cap (format.go; ring.lua places it): the lowest limit a lease on
-- the window may still be spent under and until when. A lease ends at its
-- bucket's last event, so readCap reads it only when the head (header h) is
-- the current bucket, holds two events or more and ends ahead. writeCap keeps
-- the lower limit until the later end. WCAP, WCEND: as read.
local WCAP, WCEND = {}, {}
local function readCap(key, h, n, g, unit, b, vh, hc, ho)
  local cap, cend
  if b == vh and hc > 1 and vh * g + ho * unit > now then
    local s
    if byte(h, 1) == COMPACT then
      s = capOf(CS[key] or call('GET', key))
    else
      local o = capAt(n)
      s = call('GETRANGE', key, OFF[o], OFF[o + CAPLEN - 1])
    end
    if #s >= CAPLEN then
      local cp, ce = unpack_(CAPFMT, s, 1)
      if ce > now then cap, cend = cp, ce end
    end
  end
  return cap, cend
end
local function writeCap(key, n, l, lend, cap, cend)
  if not (cend and cap <= l and cend >= lend) then
    local cp, ce = l, lend
    if cend then
      if cap < cp then cp = cap end
      if cend > ce then ce = cend end
    end
    local c = pack_(CAPFMT, cp, ce)
    if call('GETRANGE', key, '0', '0') == char(COMPACT) then
      -- After a compact record's entries, in place of any cap before.
      local s = call('GET', key)
      call('SET', key, sub(s, 1, #s - #capOf(s)) .. c, 'KEEPTTL')
      CS[key] = nil
    else
      call('SETRANGE', key, OFF[capAt(n)], c)
    end
  end
end

-- window reads record key (header h, '' when none) at now: new?, head, total,
-- head count and offset as read, current bucket, events counted now and first
-- bucket counted. advanced and used inlined: it reads only the slots they need.
local function window(key, h, period, g, n, unit)
  local fresh, vh, total, hc, ho, b, c, from
  do
    fresh = #h < 1 + HDR
    if fresh then vh, total, hc, ho = 0, 0, 0, 0 else vh, total, hc, ho = unpack_(RINGFMT, h, 2) end
    b = (now - now % g) / g
    if b < vh then b = vh end
    c, from = total, b - n
    if total > 0 then
      if b - vh > n then
        total, c = 0, 0
      elseif total == hc and hc < MAXC then
        -- All events in the head bucket (none saturated): no slot to read.
        if b - n == vh and (b - n) * g + ho * unit + period <= now then c, from = 0, b - n + 1 end
      elseif byte(h, 1) == COMPACT then
        -- Compact: the entries before b - n leave; the oldest counted may too.
        local s, j0, c0, l0 = call('GET', key), b - n, 0, 0
        CS[key] = s
        if j0 == vh then c0, l0 = hc, ho end
        for p = WR, #s - ENTRY + 1, ENTRY do
          local j, cj, oj = unpack_(ENTFMT, s, p)
          if j < j0 then total = total - cj elseif j == j0 then c0, l0 = cj, oj end
        end
        if total < 0 then total = 0 end
        c = total
        if total > 0 and c0 > 0 and j0 * g + l0 * unit + period <= now then c, from = total - c0, j0 + 1 end
      else
        local lo, hi = b - n, b - n
        if b > vh then lo = vh - n end
        local si, k = lo % (n + 1), hi - lo + 1
        local s, R
        if si + k > n + 1 then
          -- The run wraps: read the whole ring.
          s, R = call('GETRANGE', key, OFF[1 + HDR], OFF[HDR + (n + 1) * SLOT]), 1
          total = advanced(s, R, n, vh, total, b)
        else
          -- The k - 1 slots leaving, then the oldest (advanced, in short).
          s, R = call('GETRANGE', key, OFF[1 + HDR + si * SLOT], OFF[HDR + (si + k) * SLOT]), 1 - si * SLOT
          if k > 1 then
            total = total - counts(s, 1, 0, k - 2)
            if total < 0 then total = 0 end
          end
        end
        c = total
        local j0 = b - n
        if total > 0 and j0 <= vh then
          local c0, l0 = hc, ho
          if j0 < vh then c0, l0 = unpack_('>I4I2', s, R + (j0 % (n + 1)) * SLOT) end
          if c0 > 0 and j0 * g + l0 * unit + period <= now then c, from = total - c0, j0 + 1 end
        end
      end
    end
  end
  return fresh, vh, total, hc, ho, b, c, from
end

-- view sets window i's working values (window) from record key.
local function view(i, key, h, period, g, n, unit)
  local fresh, vh, total, hc, ho, b, c, from = window(key, h, period, g, n, unit)
  WKEY[i], WH[i], WFRESH[i], WVH[i], WTOT[i], WHC[i], WHO[i], WB[i], WUSED[i], WFROM[i], WADD[i] = key, h, fresh, vh, total, hc, ho, b, c, from, 0
end

-- shrinks writes full record key compact again for its head's move from vh
-- to b (shrink), to expire in px ms; a record holding total events has at
-- most that many buckets with events.
local function shrinks(key, n, vh, hc, ho, b, px)
  local rec = shrink(call('GET', key), n, vh, hc, ho, b)
  if not rec then return false end
  call('SET', key, rec, 'PX', px)
  return true
end

-- write counts count events at time at in current bucket b of record key and
-- returns total, hc, ho after; the record outlives its events: each head move
-- sets its expiry again (expiry).
local function write(key, h, fresh, vh, total, hc, ho, b, count, at, g, n, unit, ttl)
  local off
  do
    if b > vh then
      local px = expiry(b, g, n, ttl) - NOWMS
      if px ~= EXPX then EXPX, EXPS = px, format('%d', px) end
      if fresh then
        -- Written whole below.
      elseif byte(h, 1) == COMPACT then
        moveCompact(key, h, CS[key], n, vh, total, hc, ho, b, EXPS)
      elseif CMPT and total <= MAXENT and find(key, '}:w:%d+:%d+$') and shrinks(key, n, vh, hc, ho, b, EXPS) then
        -- Written compact again (shrinks).
      elseif b - vh <= 8 and b - vh <= n and vh % (n + 1) + b - vh <= n + 1 then
        -- A short move with no wrap, in one write: the old head's slot, cut
        -- from h (hc, ho unchanged), and zeros over the skipped ones.
        local x = sub(h, 14, 19)
        if b - vh > 1 then x = x .. zeros((b - vh - 1) * SLOT) end
        call('SETRANGE', key, OFF[1 + HDR + (vh % (n + 1)) * SLOT], x)
        call('PEXPIRE', key, EXPS)
      else
        for q = 1, 2 * move(n, vh, hc, ho, b), 2 do call('SETRANGE', key, OFF[HDR + MV[q]], MV[q + 1]) end
        call('PEXPIRE', key, EXPS)
      end
      hc, ho = 0, 0
    end
    -- at's offset in units, rounded up: an event is never recorded early.
    local d = at - b * g
    off = 0
    if d > 0 then off = (d + unit - 1 - (d + unit - 1) % unit) / unit end
    if hc > 0 and ho > off then off = ho end
    local hdr = pack_(RINGFMT, b, total + count, hc + count, off)
    CS[key] = nil
    if fresh and CMPT and find(key, '}:w:%d+:%d+$') then
      call('SET', key, char(COMPACT) .. hdr, 'PX', itoa(expiry(b, g, n, ttl) - NOWMS))
    elseif fresh then
      call('SET', key, blank(n), 'PX', itoa(expiry(b, g, n, ttl) - NOWMS))
      call('SETRANGE', key, '1', hdr)
    else
      call('SETRANGE', key, '1', hdr)
    end
  end
  return total + count, hc + count, off
end

-- record counts k events at time t in window i's current bucket (write).
local function record(i, k, t, g, n, unit, ttl)
  local b = WB[i]
  WTOT[i], WHC[i], WHO[i] = write(WKEY[i], WH[i], WFRESH[i], WVH[i], WTOT[i], WHC[i], WHO[i], b, k, t, g, n, unit, ttl)
  WFRESH[i], WVH[i] = false, b
end

-- blockWrite counts a block of k ending at t in coarse record y, in its end's
-- bucket e: at most one past the current (blockRing sizes the record for it).
-- At or past the head, the head moves to e first (keeping the count read now);
-- before it, into e's slot, keeping that bucket's latest event.
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

-- resetAt is untl for head bucket b, its last event at offset off.
local function resetAt(b, off, period, g, n, unit)
  local reset
  reset = b * g + off * unit + period
  if reset < (b + n) * g then reset = (b + n) * g end
  if reset > (b + n + 1) * g then reset = (b + n + 1) * g end
  return reset
end

-- standing returns window i's used, remaining and reset after the decision,
-- and for a refused request, how long until the window admits one more.
local function standing(i, limit, period, g, n, unit, counted, refused)
  local u, reset_, wait = WUSED[i], now, 0
  if counted > 0 then
    u = u + counted
    reset_ = resetAt(WB[i], WHO[i], period, g, n, unit)
  elseif u > 0 then
    local s = full(call('GET', WKEY[i]), n)
    local vh, hc, ho, from, b = WVH[i], WHC[i], WHO[i], WFROM[i], WB[i]
    reset_ = scan(s, WR, n, g, unit, period, vh, hc, ho, from, b, 0, now)
    local cap, cend = WCAP[i], WCEND[i]
    if refused and cap and cap < limit and u >= cap then
      -- Held to a lease's cap: admitted once enough slides out to fit under
      -- it, or once the cap ends and the window fits its own limit, if sooner.
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

-- newest: when ring w's newest counting bucket stops (now if none). The head
-- counts while any bucket does: only one a give-back emptied needs a read.
local function newest(w, period, g, n, unit, counted)
  if counted > 0 or WHC[w] > 0 and WUSED[w] > 0 then return resetAt(WVH[w], WHO[w], period, g, n, unit) end
  if WUSED[w] <= 0 then return now end
  local s = full(call('GET', WKEY[w]), n)
  return scan(s, WR, n, g, unit, period, WVH[w], WHC[w], WHO[w], WFROM[w], WB[w], 0, now)
end

-- scan2 is scan over a window's ring (a, read as sa) and coarse record (y, sy),
-- their buckets in the order they stop counting; now if excess never goes.
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

-- pairStanding is standing for window i counting its coarse record y (cg, cn,
-- cunit) too: used is the sum, reset the later end, and a refused wait the
-- earliest time the sum fits the limit and every cap still in force then (per
-- span between cap ends, scan2). counted, ccounted: this decision's writes.
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
        if not sa then sa, sy = full(call('GET', WKEY[i]), n), call('GET', WKEY[y]) end
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
