-- The record layout (format.go), after codec.lua, in every script that
-- reads records: the decision code, give-backs and expand. Widths in bytes:
-- a ring is head 8, total 4, head count 4, head offset 2, then n+1 slots of
-- count 4, offset 2 (counts saturate at MAXC). A window record: version 1,
-- ring. A ban record: version 1, ban end 8, offences 4, last offence 8,
-- strike period 8 and bucket width 8, ring.
local VERSION, HDR, SLOT, MAXC = 1, 18, 6, 4294967295
local RINGFMT = '>I8I4I4I2'
local EMPTY = '\0\0\0\0\0\0'
-- A window record's slots start here (1-based).
local WR = 2 + HDR
-- A compact window record: version 2, the ring's header, then one entry per
-- bucket before the head holding events, oldest first: bucket 8, count 4,
-- last-event offset 2. Past MAXENT entries, or the full ring's size, it
-- becomes a full ring.
local COMPACT, ENTRY, ENTFMT, MAXENT = 2, 14, '>I8I4I2', 24
-- The lease cap (window.lua), after a window record's slots or entries: a
-- limit 4 and an end 8 (µs).
local CAPFMT, CAPLEN = '>I4I8', 12
