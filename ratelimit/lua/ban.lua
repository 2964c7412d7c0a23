-- Decision code (redisdecider.go): the ban record and its strikes.

-- banRead returns ban record bs's (false: none) ban end, offences remembered
-- and last offence at now, and whether its strike ring is rule R's to count.
local function banRead(bs, R)
  if not bs or #bs < 37 then return 0, 0, 0, false end
  local banUntil, offences, offenceAt = get(bs, 2, 8), get(bs, 10, 4), get(bs, 14, 8)
  if offences > 0 and offenceAt + R.memory <= now then offences = 0 end
  local sring = get(bs, 22, 8) == R.sp and get(bs, 30, 8) == R.sg and #bs >= 37 + HDR + (R.sn + 1) * SLOT
  return banUntil, offences, offenceAt, sring
end

-- strike counts k strikes at now (when record) in ban record key of rule R:
-- crossing R's threshold bans the key, longer per offence remembered, and
-- starts the strikes over; the record's TTL outlives the ban, the offences and
-- the strikes. It returns whether a ban began (1), how many of k counted up to
-- it (its own included), the strikes counted now, the ban's end (0: none) and
-- the offences. banState.strike (state.go) is the Go twin.
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
