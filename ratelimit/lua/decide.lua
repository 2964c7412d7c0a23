-- Decision code (redisdecider.go): decide, which serves every plan and request.

local RES = {}

-- seedPlan reads SEED, sent after plan pl changed its periods
-- (seeding.nums), into SRC, TRY and TRANS by name: the sources a window
-- with no record may take its past from (count; each: KEYS index, period,
-- g, n, unit, coarse record's KEYS index (0: none), g, n, unit), per window
-- the sources to try (count, indexes), then the transition windows (count;
-- each: KEYS index, limit, period, g, n, unit, ttl, coarse record as a
-- source's). Indexes past the plan's windows skip coarse records (at).
local function seedPlan(pl, SEED)
  local nw, nco, CO, CP = pl.nw, pl.nco, pl.CO, pl.CP
  local SRC, TRY, TRANS = {}, {}, {}
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
    SRC[s] = {k = at(k), period = SEED[q + 1], g = SEED[q + 2], n = SEED[q + 3], unit = SEED[q + 4],
      ck = ck, cg = cg, cn = cn, cu = cu}
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
    TRANS[j] = {k = at(SEED[q]), limit = SEED[q + 1], period = SEED[q + 2], g = SEED[q + 3], n = SEED[q + 4],
      unit = SEED[q + 5], ttl = SEED[q + 6], ck = ck, cg = SEED[q + 8], cn = SEED[q + 9], cu = SEED[q + 10]}
  end
  return SRC, TRY, TRANS
end

-- seedWindow starts window i of plan pl, which has no record (key, header
-- h) after a plan edit, from the first of its sources (TRY, indexes in SRC)
-- the key has a record of, or a coarse record of (blocks count there), and
-- returns its header then.
local function seedWindow(base, pl, i, key, h, SRC, TRY)
  local w, CP, CO = pl.W[i], pl.CP, pl.CO
  for _, si in ipairs(TRY) do
    local src = SRC[si]
    local ss, cs2 = call('GET', KEYS[base + src.k]), false
    ss = full(ss, src.n)
    if not (ss and #ss >= 1 + HDR + (src.n + 1) * SLOT) then ss = false end
    if src.ck > 0 then
      cs2 = call('GET', KEYS[base + src.ck])
      if not (cs2 and #cs2 >= 1 + HDR + (src.cn + 1) * SLOT) then cs2 = false end
    end
    if ss or cs2 then
      -- The window's coarse record, if any, takes what is still being
      -- spent (one too short for its ring is another format's: left alone).
      local x, C = CP and CP[i], nil
      if x then
        local cr, ck = CO[x], KEYS[base + pl.kco + x]
        local cur = call('GET', ck)
        if cur and #cur < 1 + HDR then cur = false end
        if not cur or #cur >= WR - 1 + (cr.n + 1) * SLOT then
          C = {key = ck, g = cr.g, n = cr.n, unit = cr.unit, ttl = cr.ttl, cur = cur}
        end
      end
      if seed(key, ss, src.g, src.n, src.unit, cs2, src.cg, src.cn, src.cu, w.period, w.g, w.n, w.unit, w.ttl, floor(now / w.g), now, C) then
        return call('GETRANGE', key, '0', '18')
      end
      return h
    end
  end
  return h
end

-- transitions reads the transition windows TRANS (another plan's, while
-- an edit spreads; working windows from tb + 1) that the key has a record
-- of, TX (ntx of them): an admission must fit each and counts there too.
-- It returns them, with admit, room and lend as they hold.
local function transitions(base, TRANS, tb, admit, room, lend)
  local TX, ntx = {}, 0
  for j = 1, #TRANS do
    local tr = TRANS[j]
    local key = KEYS[base + tr.k]
    local h = call('GETRANGE', key, '0', '18')
    if #h >= 1 + HDR then
      ntx = ntx + 1
      local x = tb + ntx
      TX[ntx] = tr
      view(x, key, h, tr.period, tr.g, tr.n, tr.unit)
      WCAP[x], WCEND[x] = readCap(key, h, tr.n, tr.g, tr.unit, WB[x], WVH[x], WHC[x], WHO[x])
      local limit = tr.limit
      if WCAP[x] and WCAP[x] < limit then limit = WCAP[x] end
      local c = WUSED[x]
      if tr.ck > 0 then
        -- Its coarse record's blocks count too (working values -ntx).
        local ck = KEYS[base + tr.ck]
        view(-ntx, ck, call('GETRANGE', ck, '0', '18'), tr.period, tr.cg, tr.cn, tr.cu)
        WCAP[-ntx], WCEND[-ntx] = readCap(ck, WH[-ntx], tr.cn, tr.cg, tr.cu, WB[-ntx], WVH[-ntx], WHC[-ntx], WHO[-ntx])
        if WCAP[-ntx] and WCAP[-ntx] < limit then limit = WCAP[-ntx] end
        c = c + WUSED[-ntx]
      end
      if c >= limit then admit = false end
      if room < 0 or limit - c < room then room = limit - c end
      if (WB[x] + 1) * tr.g < lend then lend = (WB[x] + 1) * tr.g end
    end
  end
  return TX, ntx, admit, room, lend
end

-- sizeBlock sizes a block riding on an admission under plan pl (BLK,
-- blockSize): rk more admissions at the block's end rend (0, 0: none), in
-- the long windows (after the first ns = BLK.ns) and in the short ones'
-- coarse records (batch grants none without them), each with room for it.
local function sizeBlock(pl, BLK)
  local W, nw, CO, CP = pl.W, pl.nw, pl.CO, pl.CP
  local ns, rend = BLK.ns, now + BLK.life
  local lroom = 2 ^ 53
  for i = ns + 1, nw do
    local limit = W[i].limit
    if WCAP[i] and WCAP[i] < limit then limit = WCAP[i] end
    if limit - WUSED[i] - 1 < lroom then lroom = limit - WUSED[i] - 1 end
    if (WB[i] + 1) * W[i].g < rend then rend = (WB[i] + 1) * W[i].g end
  end
  for i = 1, ns do
    local x = CP[i]
    local y, g = nw + x, CO[x].g
    local limit = W[i].limit
    if WCAP[i] and WCAP[i] < limit then limit = WCAP[i] end
    if WCAP[y] and WCAP[y] < limit then limit = WCAP[y] end
    local r = limit - WUSED[i] - WUSED[y] - 1
    if r < lroom then lroom = r end
    -- Within the bucket after the current one (blockWrite).
    local last = (floor(now / g) + 2) * g
    if last < rend then rend = last end
  end
  local sc = WUSED[ns] + 1 + WUSED[nw + CP[ns]]
  local w = W[ns]
  local rk = blockSize(sc, w.period, lroom, rend - now, BLK, WKEY[ns], w.g, w.n, WVH[ns], WTOT[ns], WHC[ns], WFROM[ns])
  if rk == 0 then rend = 0 end
  return rk, rend, ns
end

-- candidates decides plan pl's candidate windows (working windows from
-- cb + 1), in records of their own, which never refuse: of this request and
-- the extra rejected locally, they count as many as fit and limit the
-- rest, each a strike of their ban policy; the strike that begins a ban,
-- those after it and all of a banned key count as banned. It returns the
-- reply's candidate fields (decode).
local function candidates(base, pl, cb, extra, peek)
  local CW, nc, nw = pl.CW, pl.nc, pl.nw
  local croom = -1
  for i = 1, nc do
    local w = CW[i]
    local key = KEYS[base + 1 + nw + i]
    view(cb + i, key, call('GETRANGE', key, '0', '18'), w.period, w.g, w.n, w.unit)
    if croom < 0 or w.limit - WUSED[cb + i] < croom then croom = w.limit - WUSED[cb + i] end
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
          local w = CW[i]
          record(cb + i, cAdm, now, w.g, w.n, w.unit, w.ttl)
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
  return cOut, cAdm, cLim, cBan, cNewBan, cStrikes, cBanUntil, cOffences
end

-- decide makes one decision (records from KEYS[base + 1]) under plan pl, with
-- the asked numbers, ADD, SEED and BLK (nil: none), and returns its reply.
local function decide(base, pl, mode, extra, want, need, life, ADD, SEED, BLK)
  local W, nw = pl.W, pl.nw
  -- Blocks (nco > 0): window i's coarse record (x = CP[i], CO[x].i = i) is
  -- working window nw + x, record KEYS[base + pl.kco + x]; the records of other
  -- periods (seeding) follow. Transition windows start after tb.
  local nco, CO, CP = pl.nco, pl.CO, pl.CP
  local tb = nw + nco

  local SRC, TRY, TRANS
  if SEED then SRC, TRY, TRANS = seedPlan(pl, SEED) end
  local peek = mode == 1

  local R = pl.ban
  local bs, banUntil, offences, offenceAt, sring
  if R then
    bs = call('GET', KEYS[base + 1])
    banUntil, offences, offenceAt, sring = banRead(bs, R)
  end
  local banned = R and banUntil > now
  local admit = not banned
  local room, lend = -1, now + life

  for i = 1, nw do
    local w = W[i]
    local limit, period, g, n, unit = w.limit, w.period, w.g, w.n, w.unit
    local key = KEYS[base + 1 + i]
    local h = call('GETRANGE', key, '0', '18')
    if #h < 1 + HDR and TRY and TRY[i] then h = seedWindow(base, pl, i, key, h, SRC, TRY[i]) end
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
    WCAP[i], WCEND[i] = readCap(key, h, n, g, unit, WB[i], WVH[i], WHC[i], WHO[i])
    if WCAP[i] and WCAP[i] < limit then limit = WCAP[i] end
    local c = WUSED[i]
    local x = CP and CP[i]
    if x then
      local cr, y = CO[x], nw + x
      local ck = KEYS[base + pl.kco + x]
      view(y, ck, call('GETRANGE', ck, '0', '18'), period, cr.g, cr.n, cr.unit)
      WCAP[y], WCEND[y] = readCap(ck, WH[y], cr.n, cr.g, cr.unit, WB[y], WVH[y], WHC[y], WHO[y])
      if WCAP[y] and WCAP[y] < limit then limit = WCAP[y] end
      c = c + WUSED[y]
    end
    if c >= limit then admit = false end
    if room < 0 or limit - c < room then room = limit - c end
    if (WB[i] + 1) * g < lend then lend = (WB[i] + 1) * g end
  end

  -- Transition windows (another plan's, while an edit spreads).
  local TX, ntx = nil, 0
  if TRANS then TX, ntx, admit, room, lend = transitions(base, TRANS, tb, admit, room, lend) end

  -- granted admissions count at once; at is the time recorded for them.
  local granted, at = 1, now
  if want > 1 and room >= need and room >= want then granted, at = want, lend else lend = 0 end
  local admitted = admit and not peek

  -- A block riding on this admission: rk more admissions, until rend.
  local rk, rend, ns = 0, 0, 0
  if BLK and admitted and ntx == 0 then rk, rend, ns = sizeBlock(pl, BLK) end

  for i = 1, nw do
    local k, t = WADD[i], now
    if admitted then k, t = k + granted, at end
    if rk > 0 and i > ns then k, t = k + rk, rend end
    if k > 0 then
      local w = W[i]
      record(i, k, t, w.g, w.n, w.unit, w.ttl)
    end
  end
  if rk > 0 then
    for x = 1, nco do
      local cr = CO[x]
      blockWrite(nw + x, rk, rend, W[cr.i].period, cr.g, cr.n, cr.unit, cr.ttl)
    end
  end
  if admitted then
    for j = 1, ntx do
      local tr = TX[j]
      record(tb + j, granted, at, tr.g, tr.n, tr.unit, tr.ttl)
    end
  end
  -- A lease caps every window it counts in until it ends.
  if admitted and granted > 1 then
    for i = 1, nw do writeCap(WKEY[i], W[i].n, W[i].limit, lend, WCAP[i], WCEND[i]) end
    for j = 1, ntx do writeCap(WKEY[tb + j], TX[j].n, TX[j].limit, lend, WCAP[tb + j], WCEND[tb + j]) end
  end
  -- A block caps every long window and coarse record until it ends.
  if rk > 0 then
    for i = ns + 1, nw do writeCap(WKEY[i], W[i].n, W[i].limit, rend, WCAP[i], WCEND[i]) end
    for x = 1, nco do
      local y = nw + x
      writeCap(WKEY[y], CO[x].n, W[CO[x].i].limit, rend, WCAP[y], WCEND[y])
    end
  end

  local CW, nc, CR = pl.CW, pl.nc, pl.cban
  local cb = tb + ntx
  local cOut, cAdm, cLim, cBan, cNewBan, cStrikes, cBanUntil, cOffences = 0, 0, 0, 0, 0, 0, 0, 0
  if nc > 0 or CR then
    cOut, cAdm, cLim, cBan, cNewBan, cStrikes, cBanUntil, cOffences = candidates(base, pl, cb, extra, peek)
  end

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
  -- The reply carries only what the plan has (decode). A block's size and
  -- end take a lease's fields: this admission plus rk, until rend.
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
    local w = W[i]
    local limit, period, g, n, unit = w.limit, w.period, w.g, w.n, w.unit
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
      if tr.ck > 0 then
        u, rem, reset_, wait = pairStanding(tb + j, -j, tr.limit, tr.period, tr.g, tr.n, tr.unit, tr.cg, tr.cn, tr.cu, 0, 0, true)
      else
        u, rem, reset_, wait = standing(tb + j, tr.limit, tr.period, tr.g, tr.n, tr.unit, 0, true)
      end
      if wait > rt then rt = wait end
    end
  end
  for i = 1, nc do
    local w = CW[i]
    local u, rem, reset_ = standing(cb + i, w.limit, w.period, w.g, w.n, w.unit, cAdm, false)
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
    -- Short form: one admission, no candidates; bare with no ban to report.
    if not R then return pack_(pl.bfmt, now, unpack(RES, 6, m)) end
    if RES[7] == 0 and RES[8] == 0 and RES[9] == 0 then return pack_(pl.bfmt, now, unpack(RES, 10, m)) end
    return pack_(pl.sfmt, now, unpack(RES, 7, m))
  end
  return pack_(pl.rfmt, unpack(RES, 1, m))
end
