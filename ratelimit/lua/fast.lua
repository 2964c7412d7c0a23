-- Decision code (script.go): fast, the common request's short path.

-- fit returns the room and lease end left once a window of limit l (under
-- cap, if any) holds c in current bucket b of width g, nil when it is full:
-- a lease ends with every window's current bucket.
local function fit(room, lend, l, cap, c, b, g)
  local m = l
  if cap and cap < m then m = cap end
  if c >= m then return nil end
  if m - c < room then room = m - c end
  if (b + 1) * g < lend then lend = (b + 1) * g end
  return room, lend
end

-- fast decides as decide does, through the same functions, a request of the
-- common plan (one to three windows, no candidate windows), asked to decide
-- with no strikes to count and nothing to add or seed. Where decide would
-- refuse, it returns nil having written nothing, and decide decides.
local function fast(base, pl, want, need, life, RSV)
  local V = pl.V
  local nw = V[1]
  local ban, bs, banUntil, offences, offenceAt, sring = pl.ban
  if ban then
    bs = call('GET', KEYS[base + 1])
    banUntil, offences, offenceAt, sring = banRead(bs, ban)
    if banUntil > now then return nil end
  end
  -- Window i's numbers start at V[6i - 4]; room starts above any limit.
  local room, lend = 2 ^ 53, now + life
  local l1, period1, g1, n1, unit1, key1, h1, fresh1, vh1, total1, hc1, ho1, b1, c1, from1, cap1, cend1
  l1, period1, g1, n1, unit1, key1 = V[2], V[3], V[4], V[5], V[6], KEYS[base + 2]
  h1 = call('GETRANGE', key1, '0', '18')
  fresh1, vh1, total1, hc1, ho1, b1, c1, from1 = window(key1, h1, period1, g1, n1, unit1)
  cap1, cend1 = readCap(key1, h1, n1, g1, unit1, b1, vh1, hc1, ho1)
  room, lend = fit(room, lend, l1, cap1, c1, b1, g1)
  if not room then return nil end
  local l2, period2, g2, n2, unit2, key2, h2, fresh2, vh2, total2, hc2, ho2, b2, c2, from2, cap2, cend2
  if nw >= 2 then
    l2, period2, g2, n2, unit2, key2 = V[8], V[9], V[10], V[11], V[12], KEYS[base + 3]
    h2 = call('GETRANGE', key2, '0', '18')
    fresh2, vh2, total2, hc2, ho2, b2, c2, from2 = window(key2, h2, period2, g2, n2, unit2)
    cap2, cend2 = readCap(key2, h2, n2, g2, unit2, b2, vh2, hc2, ho2)
    room, lend = fit(room, lend, l2, cap2, c2, b2, g2)
    if not room then return nil end
  end
  local l3, period3, g3, n3, unit3, key3, h3, fresh3, vh3, total3, hc3, ho3, b3, c3, from3, cap3, cend3
  if nw == 3 then
    l3, period3, g3, n3, unit3, key3 = V[14], V[15], V[16], V[17], V[18], KEYS[base + 4]
    h3 = call('GETRANGE', key3, '0', '18')
    fresh3, vh3, total3, hc3, ho3, b3, c3, from3 = window(key3, h3, period3, g3, n3, unit3)
    cap3, cend3 = readCap(key3, h3, n3, g3, unit3, b3, vh3, hc3, ho3)
    room, lend = fit(room, lend, l3, cap3, c3, b3, g3)
    if not room then return nil end
  end
  -- Blocks (planAt: window 1 alone has a coarse record, working values y):
  -- window 1 counts its blocks too (cy); m1 is its limit under either cap.
  local y, cy, cr, m1 = nil, 0, nil, nil
  if pl.nco == 1 then
    cr, y = pl.CO[1], nw + 1
    local ck = KEYS[base + pl.kco + 1]
    view(y, ck, call('GETRANGE', ck, '0', '18'), period1, cr.g, cr.n, cr.unit)
    WCAP[y], WCEND[y] = readCap(ck, WH[y], cr.n, cr.g, cr.unit, WB[y], WVH[y], WHC[y], WHO[y])
    cy, m1 = WUSED[y], l1
    if cap1 and cap1 < m1 then m1 = cap1 end
    if WCAP[y] and WCAP[y] < m1 then m1 = WCAP[y] end
    if c1 + cy >= m1 then return nil end
    if m1 - c1 - cy < room then room = m1 - c1 - cy end
  end
  local count, at = 1, now
  if want > 1 and room >= need and room >= want then count, at = want, lend else lend = 0 end
  -- A block (decide's, reserveSize): the long windows are window 3, or
  -- windows 2 and 3 (ns short ones, fewer than nw).
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
      -- Here ns is 1 (batch): window 1's room counts both records, and the
      -- block ends within the coarse bucket after the current (blockWrite).
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
  local ttl1 = pl.TTL[1]
  local _, _, off1 = write(key1, h1, fresh1, vh1, total1, hc1, ho1, b1, count, at, g1, n1, unit1, ttl1)
  local reset1, reset2, reset3
  reset1 = resetAt(b1, off1, period1, g1, n1, unit1)
  if nw >= 2 then
    -- Window 2 counts the block when it is long.
    if rk > 0 and ns == 1 then count, at = 1 + rk, rend end
    local ttl2 = pl.TTL[2]
    local _, _, off2 = write(key2, h2, fresh2, vh2, total2, hc2, ho2, b2, count, at, g2, n2, unit2, ttl2)
    reset2 = resetAt(b2, off2, period2, g2, n2, unit2)
  end
  if nw == 3 then
    if rk > 0 then count, at = 1 + rk, rend end
    local ttl3 = pl.TTL[3]
    local _, _, off3 = write(key3, h3, fresh3, vh3, total3, hc3, ho3, b3, count, at, g3, n3, unit3, ttl3)
    reset3 = resetAt(b3, off3, period3, g3, n3, unit3)
  end
  -- A lease caps every window until it ends; a block, every long window.
  if leased > 1 then
    writeCap(key1, n1, l1, lend, cap1, cend1)
    if nw >= 2 then
      writeCap(key2, n2, l2, lend, cap2, cend2)
    end
    if nw == 3 then
      writeCap(key3, n3, l3, lend, cap3, cend3)
    end
  elseif rk > 0 then
    lend = rend
    if ns == 1 then
      writeCap(key2, n2, l2, lend, cap2, cend2)
    end
    if nw == 3 then
      writeCap(key3, n3, l3, lend, cap3, cend3)
    end
  end
  if y then
    -- The block, in the coarse bucket of its end, capped there as every long
    -- window is; window 1's reply counts both records (pairStanding).
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
  -- With a ban rule: what decide's strike reports for an admission with no
  -- strikes, writing nothing; zeros for a key with no ban record.
  local _, strikes, bu, off = nil, 0, 0, 0
  if bs then _, _, strikes, bu, off = strike(KEYS[base + 1], bs, ban, banUntil, offences, offenceAt, sring, 0, false) end
  -- The reply, as decide's: bare or short for one admission, else whole (a
  -- block's size and end in the lease's fields; long windows count 1 + rk).
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
