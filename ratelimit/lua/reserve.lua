-- The decision code (script.go): how much a block may hold (blocks.go).

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

-- demandSpan returns the time a block's size takes the key's
-- demand to have built up over (reserveSize): the period sp of its last
-- short window, whose record key (bucket width g, n, and as window read
-- it head vh, total, head count hc and first bucket counted from) counts
-- that demand; or, while the oldest bucket of the record that holds a
-- request (now when none does) began less than sp - life ago, the time
-- since it began plus life, a block's life. Every admission the
-- window counts was decided in that bucket or later, or spent from a
-- block granted by a round trip before it, within its life (at most
-- life); a key the window has held for less than its period would
-- otherwise read as sending at a fraction of its rate until a period had
-- passed. At least life: a new key's block is at most what it has sent.
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

-- reserveSize returns the admissions of a block to count beside a
-- request admitted now (mode 2, blocks.go), worked out from the
-- counts its decision read: the requests the last short window counts
-- with this one (sc), at their rate over its period (sp, µs) or, for a
-- key the window has held for less, over the time since the oldest of
-- them (demandSpan, given the window's record key and what window read
-- of it, g .. from), scaled to the time the block could be spent
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
