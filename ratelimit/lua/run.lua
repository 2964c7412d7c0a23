-- Decision code, last file (redisdecider.go): plans, the batch, and run, the entry.

-- Plans, decoded once per call or, with a Function, once for all (DECODED, at
-- most 256). PLANS maps a call's plan indexes to them.
local DECODED, ndecoded = {}, 0
local function banRule(V, o, mult)
  if V[o] == 0 then return nil, o + 1 end
  return {thr = V[o], sp = V[o + 1], sg = V[o + 2], sn = V[o + 3], su = V[o + 4], sttl = V[o + 5],
    memory = V[o + 6], base = V[o + 7], max = V[o + 8], mult = mult}, o + 9
end
-- windowsAt reads count windows' numbers from V[o] on, each named as decide
-- reads it: limit, period, bucket width g, n, offset unit and TTL (ms).
local function windowsAt(V, o, count)
  local W = {}
  for i = 1, count do
    local q = o + 6 * (i - 1)
    W[i] = {limit = V[q], period = V[q + 1], g = V[q + 2], n = V[q + 3], unit = V[q + 4], ttl = V[q + 5]}
  end
  return W, o + 6 * count
end
local function planAt(PLANS, p)
  local pl = PLANS[p]
  if pl then return pl end
  local s, mult, cmult = ARGV[3 * p], ARGV[3 * p + 1], ARGV[3 * p + 2]
  pl = DECODED[s]
  if not pl or pl.mults ~= mult or pl.cmults ~= cmult then
    local V = {unpack_('>' .. rep('I8', #s / 8), s, 1)}
    local nw = V[1]
    local W, o = windowsAt(V, 2, nw)
    local ban
    ban, o = banRule(V, o, tonumber(mult))
    local nc = V[o]
    local CW
    CW, o = windowsAt(V, o + 1, nc)
    local cban
    cban, o = banRule(V, o, tonumber(cmult))
    -- Blocks (Go's plan.blocks): the count of coarse records, then each as
    -- its window's index, period, bucket width, n, offset unit and TTL.
    local nco, CO, CP = 0, nil, nil
    -- (V's last value is unpack's next position, not the plan's.)
    if o <= #s / 8 then nco = V[o] end
    if nco > 0 then
      CO, CP = {}, {}
      for x = 1, nco do
        local q = o + 1 + 6 * (x - 1)
        CO[x] = {i = V[q], g = V[q + 2], n = V[q + 3], unit = V[q + 4], ttl = V[q + 5]}
        CP[V[q]] = x
      end
    end
    local fields = 5 + 2 * (nw + nc)
    if ban then fields = fields + 4 end
    if nc > 0 then fields = fields + 4 end
    if cban then fields = fields + 4 end
    -- The short forms: now, with a ban rule the strikes, ban end and
    -- offences (not in the bare form), then per window used and reset.
    pl = {nw = nw, W = W, nc = nc, CW = CW, ban = ban, cban = cban, rfmt = '>' .. rep('i8', fields),
      sfmt = '>' .. rep('i8', 4 + 2 * nw), bfmt = '>' .. rep('i8', 1 + 2 * nw),
      mults = mult, cmults = cmult,
      nco = nco, CO = CO, CP = CP, kco = 1 + nw + nc + (cban and 1 or 0)}
    if ndecoded >= 256 then DECODED, ndecoded = {}, 0 end
    DECODED[s], ndecoded = pl, ndecoded + 1
  end
  PLANS[p] = pl
  return pl
end

-- The call: decisions, next one's position and KEYS base, replies, plans met.
local CALLS, POS, BASE, OUT, PLANS
local ADD = {}
-- A block's numbers (blockAsk.nums), one table reused: a table per decision
-- is garbage. replicas, margin, least (the smallest block), allow (the round
-- trips' allowance, µs), ns (short windows); then the ask's most and life.
local BLKS = {}

-- batch makes the call's decisions from POS on, in order. POS and BASE move
-- past a decision before it is made, so that after one fails (run catches it)
-- the batch goes on.
local function batch()
  local calls, out = CALLS, OUT
  while POS <= #calls do
    local nk, p, na, pos = unpack_('>I8I8I8', calls, POS)
    local base = BASE
    POS, BASE = pos, base + nk
    local pl = planAt(PLANS, p)
    local mode, extra, want, need, life = 0, 0, 1, 1, 1
    -- fixed: how many of the numbers are the ask (the rest: adds, seeding).
    local fixed, BLK = 5
    -- A plain request (to decide, with no strikes and no lease) sends none.
    if na > 0 then
      mode, extra, want, need, life, pos = unpack_('>I8I8I8I8I8', calls, pos)
      if mode == 2 then
        -- Decide and count a block (blockSize): its numbers follow; want and
        -- life are the block's most and life, not a lease's.
        BLK = BLKS
        BLK.replicas, BLK.margin, BLK.least, BLK.allow, BLK.ns, pos = unpack_('>I8I8I8I8I8', calls, pos)
        BLK.most, BLK.life = want, life
        -- Only where each short window has a coarse record to count it.
        if BLK.ns < 1 or pl.nco ~= BLK.ns then BLK = nil end
        want, need, life, fixed = 1, 1, 1, 10
      end
      POS = pos + 8 * (na - fixed)
    end
    local nw = pl.nw
    -- Admissions to add come only when there are any (or seeding follows).
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
    out[#out + 1] = decide(base, pl, mode, extra, want, need, life, ADD, SEED, BLK)
  end
end

-- run decides a call's batch, in order, at one reading of the clock. A failed
-- decision replies "E" and the error; the rest go on (one pcall for all).
local function run(keys, args)
  if not byte then init() end
  KEYS, ARGV = keys, args
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  CALLS, POS, BASE, OUT, PLANS = ARGV[1], 1, 0, {}, {}
  -- ARGV[2]: ends in "c" where compact records are in force (finalized).
  CMPT = byte(ARGV[2], -1) == 99
  CS = {}
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
  return OUT
end
