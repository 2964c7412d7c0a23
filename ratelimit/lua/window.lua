-- The decision code (script.go): a window record as a decision sees and
-- writes it, its lease cap, and what a window reports after a decision.

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
-- and write it through these two functions.
local CAPFMT, CAPLEN = '>I4I8', 12
local WCAP, WCEND = {}, {}
local function capAt(n) return WR - 1 + (n + 1) * SLOT end
local function readCap(key, n, g, unit, b, vh, hc, ho)
  local cap, cend
  if b == vh and hc > 1 and vh * g + ho * unit > now then
    local o = capAt(n)
    local s = call('GETRANGE', key, OFF[o], OFF[o + CAPLEN - 1])
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
    call('SETRANGE', key, OFF[capAt(n)], pack_(CAPFMT, cp, ce))
  end
end

-- window reads window record key (header h already read: '' when none)
-- at now: whether it is new, its head, total, head count and offset as
-- read, the current bucket, the events counted now and the first bucket
-- counted. It reads the slots that advanced and used need: those leaving
-- the ring as the head moves, and the oldest still in it. The same as
-- advanced and used above, written out for the common case. Both
-- decision paths see a window through this function.
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
        -- Every bucket it had has slid out.
        total, c = 0, 0
      elseif total == hc and hc < MAXC then
        -- Every event is in the head bucket (no count saturated, so every
        -- other slot holds zero): nothing else can leave, and the head
        -- bucket's count and offset are in the header. No slot to read: a
        -- key's first burst in a period, say, lands here.
        if b - n == vh and (b - n) * g + ho * unit + period <= now then c, from = 0, b - n + 1 end
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
        -- The oldest bucket leaves as soon as its last event is a full
        -- period old.
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

-- write counts count events at time at in the current bucket b of
-- window record key (new or not, with header h, and head vh, total, head
-- count hc and offset ho as read from it): one header write (and the
-- slots the head leaves behind when it moves, with a TTL refresh), or the
-- whole record when it is new. It returns the record's total, head
-- count and head offset after. Both decision paths write through it.
local function write(key, h, fresh, vh, total, hc, ho, b, count, at, g, n, unit, ttl)
  local off
  do
    if b > vh then
      if fresh then
        -- Written whole below.
      elseif b - vh <= 8 and b - vh <= n and vh % (n + 1) + b - vh <= n + 1 then
        -- The common move, a few buckets with no wrap: the old head's slot
        -- and zeros over the skipped ones, in one write (move, in short).
        -- The old head's count and offset are the header's own bytes (as
        -- read: hc and ho have not changed), cut rather than packed.
        local x = sub(h, 14, 19)
        if b - vh > 1 then x = x .. zeros((b - vh - 1) * SLOT) end
        call('SETRANGE', key, OFF[1 + HDR + (vh % (n + 1)) * SLOT], x)
      else
        for q = 1, 2 * move(n, vh, hc, ho, b), 2 do call('SETRANGE', key, OFF[HDR + MV[q]], MV[q + 1]) end
      end
      hc, ho = 0, 0
    end
    -- The offset of at in its bucket, in units, rounded up.
    local d = at - b * g
    off = 0
    if d > 0 then off = (d + unit - 1 - (d + unit - 1) % unit) / unit end
    if hc > 0 and ho > off then off = ho end
    local hdr = pack_(RINGFMT, b, total + count, hc + count, off)
    if fresh then
      call('SET', key, blank(n), 'PX', itoa(expiry(b, g, n, ttl) - NOWMS))
      call('SETRANGE', key, '1', hdr)
    else
      call('SETRANGE', key, '1', hdr)
      if b > vh then
        -- The expiry (expiry, written out): set unless finalized and the
        -- head stays in an epoch that began after FIN.
        local E = (n - n % 4) / 4
        if E < 1 then E = 1 end
        local e0 = b - b % E
        if FIN == 0 or vh < e0 or e0 * g < FIN then
          local x = ceil((e0 + E) * g / 1000) + ttl - NOWMS
          if x ~= EXPX then EXPX, EXPS = x, format('%d', x) end
          call('PEXPIRE', key, EXPS)
        end
      end
    end
  end
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
local function resetAt(b, off, period, g, n, unit)
  local reset
  reset = b * g + off * unit + period
  if reset < (b + n) * g then reset = (b + n) * g end
  if reset > (b + n + 1) * g then reset = (b + n + 1) * g end
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
