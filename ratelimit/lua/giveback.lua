-- giveBackScript (giveback.go), after codec.lua and layout.lua: takes
-- unspent admissions back; its keys, arguments and reply are described
-- there. A full ring holds bucket b at slot b mod (n+1); a compact record
-- holds an entry for it if it counted any.
local byte, char, floor, unpack, tonumber = string.byte, string.char, math.floor, unpack, tonumber
local unpack_, pack_ = codec()
local HDRS, OFS = tostring(HDR), {}
local function ofs(v) local o = OFS[v]; if not o then o = string.format('%d', v); OFS[v] = o end; return o end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out, ki = {}, 1
for gi = 1, #ARGV do
  local A = ARGV[gi]
  local k, at, m = unpack_('>I8I8I8', A, 1)
  -- Granted at or before the key's last reset: its records are gone.
  local mark = redis.call('GET', KEYS[ki])
  local live = not mark or tonumber(mark) < at
  local most = 0
  for i = 1, m do
    local key = KEYS[ki + i]
    local b, n, g = unpack_('>I8I8I8', A, 1 + 24 * i)
    local lo = (now - now % g) / g - n
    -- A bucket the window no longer holds is left alone.
    local h = live and b >= lo and redis.call('GETRANGE', key, '0', HDRS) or ''
    local form = #h == 1 + HDR and byte(h, 1)
    if form == VERSION or form == COMPACT then
      local vh, total, hc = unpack_('>I8I4I4', h, 2)
      -- A saturated total or count is left alone: its true value is unknown.
      -- (Total and head count start at byte 9, from 0.)
      if total < MAXC then
        if b == vh then
          local d = math.min(k, hc)
          if d > 0 and hc < MAXC then
            redis.call('SETRANGE', key, '9', pack_('>I4I4', total - d, hc - d))
            if d > most then most = d end
          end
        elseif b < vh and b >= vh - n then
          local pos, c = 1 + HDR + SLOT * (b % (n + 1)), 0
          if form == COMPACT then
            -- Bucket b's entry, if it has one: its count follows the bucket.
            local all = redis.call('GET', key)
            pos = nil
            for p = WR, #all - ENTRY + 1, ENTRY do
              if unpack_('>I8', all, p) == b then pos, c = p + 7, unpack_('>I4', all, p + 8) end
            end
          else
            local s = redis.call('GETRANGE', key, ofs(pos), ofs(pos + 3))
            if #s == 4 then c = unpack_('>I4', s, 1) end
          end
          local d = math.min(k, c)
          if d > 0 and c < MAXC then
            redis.call('SETRANGE', key, ofs(pos), pack_('>I4', c - d))
            redis.call('SETRANGE', key, '9', pack_('>I4', total - d))
            if d > most then most = d end
          end
        end
      end
    end
  end
  out[gi] = most
  ki = ki + 1 + m
end
return out
