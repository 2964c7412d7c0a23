-- Decision code (redisdecider.go): how much a block may hold (lease.go).

-- firstIn returns the first slot of i0 .. i1 of s holding a count (nil: none).
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

-- demandSpan returns the span the demand counted by the last short window
-- (period sp; record key as window read it) built up over: sp, or for a key
-- younger than that, the time since its oldest counted request's bucket plus
-- life (a block's, within which an admission may be spent), at least life.
-- Otherwise a young key would read as sending at a fraction of its rate.
local function demandSpan(key, sp, g, n, vh, total, hc, from, life)
  local t0 = now
  if total > 0 and from <= vh then
    local j = vh
    if total ~= hc and from < vh then
      local s = sub(full(call('GET', key), n), WR, HDR + (n + 1) * SLOT + 1)
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

-- blockSize returns a block's size beside a request admitted now (mode 2,
-- lease.go): sc, what the last short window counts with it, at its rate over
-- sp (or demandSpan) times rest less the round trips' allowance; at most the
-- replica's share (most) and lroom (the least room a long window has left) /
-- (margin * replicas); 0 below the smallest block (least).
local function blockSize(sc, sp, lroom, rest, BLK, key, g, n, vh, total, hc, from)
  local num = sc * (rest - BLK.allow)
  if num <= 0 or lroom <= 0 then return 0 end
  local most = BLK.most
  local m = floor(lroom / (BLK.margin * BLK.replicas))
  if m < most then most = m end
  if most < BLK.least or most < 1 then return 0 end
  local k = num / sp
  if k < most and sp > BLK.life then
    sp = demandSpan(key, sp, g, n, vh, total, hc, from, BLK.life)
    k = num / sp
  end
  -- A product past 2^52 may be rounded up: one less keeps the floor from
  -- rising above the exact quotient's.
  if num > 2 ^ 52 then k = k - 1 end
  k = floor(k)
  if k > most then k = most end
  if k < BLK.least or k < 1 then return 0 end
  return k
end
