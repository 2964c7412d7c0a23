package ratelimit

import (
	"strings"
	"time"
)

// The state format, version 1: all the limiter stores in Redis, the exact bytes
// lua/ reads and writes; format_test.go checks every field at its maximum.
//
// Numbers are unsigned big-endian; no width depends on a policy, so no limit
// can overflow a field. Plan edits keep a key's records: each window is its own
// record, named by its geometry; bans, offences and strikes share one, kept
// whatever the windows do (a new strike window restarts only strikes).
//
// Keys (the braces put a key's records in one Cluster slot, for one script):
//
//	PREFIX{KEY}:w:PERIOD:GRAN  window record (PERIOD, GRAN in µs)
//	PREFIX{KEY}:b:PERIOD:GRAN  short window's coarse record (lease.go)
//	PREFIX{KEY}:c:PERIOD:GRAN  candidate window record (window layout)
//	PREFIX{KEY}:ban            ban record
//	PREFIX{KEY}:cban           candidate ban record (ban layout)
//	PREFIX{KEY}:reset          server time of the last Reset (µs, decimal)
//	PREFIX{periods}            periods each policy had lately (registry.go)
//
// A ring, in both records, covers buckets head-n .. head:
//
//	field        bytes    meaning                           maximum
//	head         8        newest bucket (time/gran)         2^53, Lua-exact
//	total        4        events in buckets head-n .. head  maxCount
//	head count   4        events in the head bucket         maxCount
//	head offset  2        head's last event, in units from  maxOffset
//	                      its start, rounded up
//	slots        6·(n+1)  bucket j at slot j mod (n+1):
//	                      count (4), last-event offset (2)
//
// Slots after the head are stale: read as empty, zeroed when the head passes. A
// window's total is at most 2·limit (the oldest bucket may still be stored
// while the newest admit a limit) plus the admissions made without Redis
// (input.add: at most a limit per round trip, about one in all); MaxLimit
// leaves room for over four limits. Counts saturate at maxCount, never wrap;
// strikes, not bounded by a limit, saturate far above any threshold.
//
// Window record: version (1), ring, then the lease cap once a lease is granted
// on it. TTL: its head bucket's epoch end (n/4 buckets) plus the period, two
// buckets and 1 ms, set whenever the head moves. Releases before this format
// set the period, two buckets and 1 ms from now on every head move: never
// later.
//
// Lease cap, after the ring:
//
//	field  bytes  meaning                                       maximum
//	limit  4      lowest limit a lease here may be spent under  MaxLimit
//	until  8      when the last such lease ends (µs)            2^53
//
// While replicas disagree on a key's plan, one may admit under a higher limit
// while another's lease is unspent: the cap holds the window to the lower limit
// until the lease ends. It is read only while a lease may be spent (the head
// bucket is current, holds two events or more, and its last event lies ahead).
// Releases before it ignore it: their own admissions are not held to another
// plan's lease.
//
// Compact window record, version 2, written only while finalized records are
// in force (finalize.go): version, the ring's header (head, total, head count,
// head offset, as above), then per bucket before the head that holds events,
// oldest first, an entry:
//
//	field   bytes  meaning                            maximum
//	bucket  8      its index (time/gran)              2^53
//	count   4      its events                         maxCount
//	offset  2      its last event, in units           maxOffset
//
// then, while a lease is being spent, the lease cap (as above). Entries are 14
// bytes and the cap 12, so the record's length tells whether it has one.
//
// A head move rewrites it whole: the old head joins the entries, those before
// head-n leave, and so does a cap that has ended. Past compactMaxEntries
// entries, or the full ring's size, it is rewritten as the full ring (version
// 1), cap after the ring, and goes back to compact at a head move that leaves
// at most compactMaxEntries buckets holding events. Its expiry is a full
// record's. Every reader of this release takes both forms; Unfinalize writes
// compact ones back as full rings, since older releases read only version 1.
// A release from before caps in compact records reads such a record and
// ignores its cap, as releases from before caps do.
//
// Ban record: version (1), ban end µs (8), offences (4), last offence µs (8),
// strike period µs (8), strike bucket width µs (8), strike ring. TTL: until the
// ban, the offence memory and the strikes have expired.
//
// Versions. A record's first byte is its version. A later release may append
// fields, but must keep these fields' meaning and the version; readers ignore
// bytes they do not know and writers change only their own (SETRANGE), so
// releases that differ in extensions share one Redis. A change that cannot be
// an extension takes new key names. The layout before ("v3") used PREFIX{KEY}:w
// and :b, which this one never touches.
const (
	formatVersion = 1

	headBytes   = 8
	countBytes  = 4
	offsetBytes = 2
	ringHeader  = headBytes + 2*countBytes + offsetBytes // 18
	slotBytes   = countBytes + offsetBytes               // 6
	// leaseCapBytes is the lease cap's size: a limit (4) and an end (8).
	leaseCapBytes = 4 + 8

	windowRingAt = 2 // 1-based position of the ring in a window record

	// A compact window record: its version, an entry's size (bucket 8, count
	// 4, offset 2) and the most entries before it becomes a full ring.
	compactVersion    = 2
	compactEntryBytes = 8 + countBytes + offsetBytes
	compactMaxEntries = 24

	maxCount    = 1<<(8*countBytes) - 1
	maxOffset   = 1<<(8*offsetBytes) - 1
	maxOffences = maxCount
	maxBanMicro = int64(1) << 50 // ~35 years: far inside the 8-byte ban end
)

// Limits of the accepted configuration; Policy.Validate enforces them.
const (
	// MaxLimit is the largest limit of a window or ban threshold.
	MaxLimit = 1_000_000_000
	// MinPeriod is the shortest period of a window or strike window, enforced
	// exactly: 8-byte bucket indexes never truncate, even at 1 µs.
	MinPeriod = time.Millisecond
	// MaxPeriod is the longest period of a window or strike window.
	MaxPeriod = 366 * 24 * time.Hour
)

// ringSize is the number of bytes of a ring with n+1 slots.
func ringSize(n int64) int64 { return ringHeader + (n+1)*slotBytes }

// banKey returns the Redis key of key's ban record.
func banKey(prefix, key string) string { return prefix + "{" + key + "}:ban" }

// windowKey is the name of key's record of window r (stateKeys' name).
func windowKey(prefix, key string, r *ring) string { return prefix + "{" + key + "}:w:" + r.name }

// coarseKey is the name of the coarse record r of key's window (lease.go).
func coarseKey(prefix, key string, r *ring) string { return prefix + "{" + key + "}:b:" + r.name }

// resetMarkKey is the name of key's reset mark.
func resetMarkKey(prefix, key string) string { return prefix + "{" + key + "}:reset" }

// candidateBanKey returns the Redis key of key's candidate ban record.
func candidateBanKey(prefix, key string) string { return prefix + "{" + key + "}:cban" }

// stateKeys returns the script's KEYS for key under pl (redisdecider.go),
// cut from one string so that a decision allocates its keys' bytes once.
func stateKeys(prefix, key string, pl *plan) []string {
	size := pl.keyCount()*(len(prefix)+len(key)+2) + len(":ban")
	for i := range pl.windows {
		size += len(":w:") + len(pl.windows[i].name)
	}
	for i := range pl.candidates {
		size += len(":c:") + len(pl.candidates[i].name)
	}
	if pl.cban.on {
		size += len(":cban")
	}
	for i := range pl.coarse {
		size += len(":b:") + len(pl.coarse[i].name)
	}
	var all strings.Builder
	all.Grow(size)
	keys := make([]string, 0, pl.keyCount())
	// A Builder never changes bytes it has written: each name stays as cut.
	name := func(kind, suffix string) {
		from := all.Len()
		all.WriteString(prefix)
		all.WriteByte('{')
		all.WriteString(key)
		all.WriteByte('}')
		all.WriteString(kind)
		all.WriteString(suffix)
		keys = append(keys, all.String()[from:])
	}
	name(":ban", "")
	for i := range pl.windows {
		name(":w:", pl.windows[i].name)
	}
	for i := range pl.candidates {
		name(":c:", pl.candidates[i].name)
	}
	if pl.cban.on {
		name(":cban", "")
	}
	for i := range pl.coarse {
		name(":b:", pl.coarse[i].name)
	}
	return keys
}

// seedKeys appends to keys the records of the other periods sd names.
func seedKeys(prefix, key string, sd *seeding, keys []string) []string {
	if sd == nil {
		return keys
	}
	for i := range sd.extra {
		keys = append(keys, prefix+"{"+key+"}:w:"+sd.extra[i].name)
	}
	for i := range sd.coarse {
		keys = append(keys, prefix+"{"+key+"}:b:"+sd.coarse[i].name)
	}
	return keys
}

// keySlot returns key's Redis Cluster slot: CRC16 of its hash tag (between
// its first '{' and the next '}', if not empty) or the whole key, mod 16384.
func keySlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					break
				}
			}
			break
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc) % 16384
}

// crc16Table is CRC16-XMODEM (polynomial 0x1021), Redis Cluster's slot hash.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
