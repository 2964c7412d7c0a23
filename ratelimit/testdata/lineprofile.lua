-- A line profile of the decision code: how many Lua interpreter
-- instructions each of its lines and functions runs per decision, for
-- BenchmarkLuaLineProfile (lineprofile_test.go), which writes the data
-- file this reads (arg[1]): BATCHES (each call's KEYS), ARGV, CODE (the
-- decision code), REF (the reference library), FN (a reference function
-- to profile instead of the decision code, or nil), PASSES and STEP (µs
-- between passes). Redis's commands and struct codec are stood in for by
-- Lua of another chunk, which the count leaves out: what is counted is the
-- decision code's own interpretation, not what Redis does for it.
dofile(arg[1])

local DB = {}
local clock = 1900000000 * 1000000
local function call(cmd, ...)
  local a = {...}
  if cmd == 'TIME' then return {tostring(math.floor(clock / 1000000)), tostring(clock % 1000000)} end
  if cmd == 'GETRANGE' then return string.sub(DB[a[1]] or '', tonumber(a[2]) + 1, tonumber(a[3]) + 1) end
  if cmd == 'GET' then return DB[a[1]] or false end
  if cmd == 'SETRANGE' then
    local s, o, v = DB[a[1]] or '', tonumber(a[2]), a[3]
    if #s < o then s = s .. string.rep('\0', o - #s) end
    DB[a[1]] = string.sub(s, 1, o) .. v .. string.sub(s, o + #v + 1)
    return #DB[a[1]]
  end
  if cmd == 'SET' then DB[a[1]] = a[2]; return 'OK' end
  if cmd == 'PEXPIRE' then return 1 end
  error('lineprofile: no stand-in for ' .. cmd)
end
local FNS = {}
redis = {call = call, register_function = function(name, f) FNS[name] = f end}
struct = assert(loadstring([[
local M = {}
function M.unpack(f, s, p)
  local out, m = {}, 0
  for d in string.gmatch(f, '[Ii](%d)') do
    local v, w = 0, tonumber(d)
    for i = p, p + w - 1 do v = v * 256 + string.byte(s, i) end
    m = m + 1
    out[m], p = v, p + w
  end
  out[m + 1] = p
  return unpack(out, 1, m + 1)
end
function M.pack(f, ...)
  local args, out, m = {...}, {}, 0
  for d in string.gmatch(f, '[Ii](%d)') do
    m = m + 1
    local v, x = args[m], ''
    for _ = 1, tonumber(d) do
      x = string.char(v % 256) .. x
      v = math.floor(v / 256)
    end
    out[m] = x
  end
  return table.concat(out)
end
return M]], '=stand-in'))()

-- The passes before the last write the records with the decision code;
-- the last runs what is profiled.
local name = FN and 'reference' or 'decision'
local run = assert(loadstring(CODE .. '\nreturn run', FN and 'warm-up' or name))()
local measured = run
if FN then
  assert(loadstring(REF, name))()
  measured = FNS[FN]
end
local function pass(f) for _, keys in ipairs(BATCHES) do f(keys, ARGV) end end
for _ = 1, PASSES - 1 do
  pass(run)
  clock = clock + STEP
end

local lines, fns = {}, {}
debug.sethook(function()
  local info = debug.getinfo(2, 'Sl')
  if info.source == name then
    lines[info.currentline] = (lines[info.currentline] or 0) + 1
    fns[info.linedefined] = (fns[info.linedefined] or 0) + 1
  end
end, '', 1)
pass(measured)
debug.sethook()

local decisions = 0
for _, keys in ipairs(BATCHES) do decisions = decisions + #keys / KEYS_PER_DECISION end
local text = {}
for l in ((FN and REF or CODE) .. '\n'):gmatch('([^\n]*)\n') do text[#text + 1] = l end
local total = 0
for _, c in pairs(fns) do total = total + c end
print(string.format('total %.1f', total / decisions))
local function report(kind, t)
  local rows = {}
  for l, c in pairs(t) do rows[#rows + 1] = {l, c} end
  table.sort(rows, function(a, b) return a[2] > b[2] end)
  for i = 1, math.min(#rows, TOP) do
    local l, c = rows[i][1], rows[i][2]
    print(string.format('%s %8.1f %5d  %s', kind, c / decisions, l, (text[l] or ''):sub(1, 100)))
  end
end
report('fn', fns)
report('line', lines)
