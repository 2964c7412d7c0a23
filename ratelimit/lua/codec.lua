-- codec returns unpack_ and pack_ for big-endian unsigned integers ('>I6I2');
-- unpack_(f, s, p) returns the values, then the next position. Redis's struct
-- library where present, else (miniredis) the same in Lua for '>' and I1 .. I8
-- (TestCodecMatchesStruct). Called at run time: a Function loads without it.
local function codec()
  local lib = rawget(_G, 'struct')
  if lib then return lib.unpack, lib.pack end
  local byte, char, floor, unpack = string.byte, string.char, math.floor, _G.unpack
  local function unpack_(f, s, p)
    local out, m = {}, 0
    for d in string.gmatch(f, '[Ii](%d)') do
      local v, w = 0, tonumber(d)
      for i = p, p + w - 1 do v = v * 256 + byte(s, i) end
      m = m + 1
      out[m] = v
      p = p + w
    end
    out[m + 1] = p
    return unpack(out, 1, m + 1)
  end
  local function pack_(f, ...)
    local args, out, m = {...}, {}, 0
    for d in string.gmatch(f, '[Ii](%d)') do
      m = m + 1
      local v, x = args[m], ''
      for _ = 1, tonumber(d) do
        x = char(v % 256) .. x
        v = floor(v / 256)
      end
      out[m] = x
    end
    return table.concat(out)
  end
  return unpack_, pack_
end
