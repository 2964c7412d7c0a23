-- codec returns unpack_ and pack_: big-endian unsigned integers of the
-- given byte widths ('>I6I2I3'), read from string s at position p (the
-- values, then the position after them) or packed into one string. Redis
-- has them in C (the struct library, several times faster than decoding
-- byte by byte in Lua); elsewhere (miniredis in tests) the same functions
-- are written in Lua, for the formats used here: '>' then 'I' with a
-- width of 1 to 8. TestCodecMatchesStruct checks that they agree. Every
-- script starts with this file; each calls codec once, where Redis's
-- libraries are there (a Function library's code at load time has none).
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
