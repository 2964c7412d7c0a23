package ratelimit

import (
	"strings"
	"time"
)

// The state format, version 1. Everything the limiter stores in Redis is
// described here; the decision code (lua/) reads and writes exactly these bytes, and
// format_test.go checks every field at its maximum.
//
// All numbers are unsigned big-endian integers. No width depends on a
// policy's numbers, so no limit can make a field overflow, and a key's
// records survive plan edits:
//
//   - Each window is its own record, named by its geometry (period and
//     bucket width): changing a window's limit keeps its counts, and adding
//     or removing a window leaves the others alone.
//   - Bans, offences and strikes live in one record of their own, kept
//     whatever the windows do. The strike ring inside it is tied to the
//     strike window's geometry: when the strike window itself is changed,
//     strikes start over; the ban and the offence history are kept.
//
// Keys (KEY is the caller's key; the braces make Redis Cluster place all
// of a key's records in one slot, so one script can touch them all):
//
//	PREFIX{KEY}:w:PERIOD:GRAN   window record (PERIOD and GRAN in µs)
//	PREFIX{KEY}:b:PERIOD:GRAN   coarse record of a short window (the window
//	                            record's layout; GRAN is blockLife, n one
//	                            more than the period spans: blocks.go)
//	PREFIX{KEY}:ban             ban record
//	PREFIX{KEY}:c:PERIOD:GRAN   candidate window record (the window record's layout)
//	PREFIX{KEY}:cban            candidate ban record (the ban record's layout)
//	PREFIX{KEY}:reset           reset mark: the server time of the key's
//	                            last Reset, µs, in decimal (resetRecords)
//
// A window record that does not exist yet may be started from the key's
// record of another period (seed in lua/ring.lua), when a plan edit changed
// periods; PREFIX{periods} (registry.go) lists the periods each policy
// had lately, for that.
//
// A ring (the body of both records) covers the buckets head-n .. head:
//
//	field        bytes  meaning                                       maximum
//	head         8      index of the newest bucket (time/gran)        2^53 (exact in Lua)
//	total        4      events in buckets head-n .. head              maxCount
//	head count   4      events in the head bucket                     maxCount
//	head offset  2      head bucket's last event, in units from its   maxOffset
//	                    start, rounded up
//	slots        6·(n+1) per older bucket j, at slot j mod (n+1):
//	                    count (4) and last-event offset (2)
//
// Slots of buckets after the stored head are stale and read as empty; they
// are zeroed when the head passes them. A window's total is at most 2·limit
// (the oldest bucket may still be stored while the newest admit a full
// limit), plus the admissions replicas made without Redis and add when it
// is back (input.add, at most a limit per round trip, in practice about
// one limit in all). MaxLimit leaves room for more than four limits, so no
// accepted limit can wrap a count; counts saturate at maxCount rather than
// wrap. Strike counts are not bounded by a limit (locally answered
// rejections arrive in batches); they saturate too, far above any
// threshold.
//
// Window record: version (1), ring, and once a lease has been granted on
// it, the lease cap (an extension, below). TTL: until the end of its head
// bucket's epoch (n/4 buckets) plus the period, two buckets and a
// millisecond; set whenever its head moves, and once records are
// finalized (finalize.go) only when it moves into a new epoch. Releases
// before finalizing refresh it to the period, two buckets and a
// millisecond from now on every head move, never later than this.
//
// Lease cap (window record, after the ring; absent until a lease is
// granted on the window):
//
//	field        bytes  meaning                                       maximum
//	limit        4      the lowest limit under which a lease on this  MaxLimit
//	                    window may still be spent
//	until        8      when the last such lease ends (µs)            2^53
//
// A lease's admissions are counted when it is granted and spent later, by
// the replica that holds it, under the limits of its plan. While replicas
// disagree on a key's plan, another may admit on the same window under a
// higher limit meanwhile; the cap holds every decision on the window to
// the lower limit until the lease ends, so that the leased admissions,
// when spent, are held to their plan's limits too. A decision reads it only
// while a lease may still be spent (the head bucket is the current one,
// holds two events or more, and its last event, where a lease's end is
// recorded, lies ahead). Releases before it ignore it: while one runs
// beside this one, its own admissions are not held to another plan's
// lease.
//
// Ban record: version (1), ban end µs (8), offences (4), last offence µs
// (8), strike period µs (8), strike bucket width µs (8), strike ring. TTL:
// until the ban, the offence memory and the strikes have all expired.
//
// Versions. The first byte of a record is its version. A later release
// may append fields after the ones above and must keep their meaning and
// the version number; readers ignore bytes they do not know, and writers
// change only the bytes they own (SETRANGE), so releases that differ in
// such extensions run side by side on one Redis without resetting each
// other. A change that cannot be an extension must use new key names, so
// that no release ever misreads another's record. The release before this
// format (layout "v3") kept its state under PREFIX{KEY}:w and PREFIX{KEY}:b,
// which this one never reads or writes (see README, "Upgrading").
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

	banFixed  = 1 + 8 + 4 + 8 + 8 + 8 // version .. strike bucket width
	banRingAt = banFixed + 1          // 1-based position of the strike ring

	maxCount    = 1<<(8*countBytes) - 1
	maxOffset   = 1<<(8*offsetBytes) - 1
	maxOffences = maxCount
	maxBanMicro = int64(1) << 50 // ~35 years: far inside the 8-byte ban end
)

// Limits of the accepted configuration; Policy.Validate enforces them.
const (
	// MaxLimit is the largest limit a window (or a ban threshold) may
	// have: four times it still fits a count (see above).
	MaxLimit = 1_000_000_000
	// MinPeriod is the shortest period a window (or a strike window) may
	// have. It is enforced exactly: bucket indexes are 8 bytes wide, so
	// even a 1 µs bucket never truncates.
	MinPeriod = time.Millisecond
	// MaxPeriod is the longest period a window (or a strike window) may
	// have.
	MaxPeriod = 366 * 24 * time.Hour
)

// ringSize is the number of bytes of a ring with n+1 slots.
func ringSize(n int64) int64 { return ringHeader + (n+1)*slotBytes }

// banKey returns the Redis key of key's ban record. The braces make
// Redis Cluster hash only the key itself, so all of a key's records land
// in one slot and one script can touch them (format.go).
func banKey(prefix, key string) string { return prefix + "{" + key + "}:ban" }

// windowKey is the name of key's record of window r (stateKeys' name).
func windowKey(prefix, key string, r *ring) string { return prefix + "{" + key + "}:w:" + r.name }

// coarseKey is the name of the coarse record r of key's window (blocks.go).
func coarseKey(prefix, key string, r *ring) string { return prefix + "{" + key + "}:b:" + r.name }

// resetMarkKey is the name of key's reset mark: the server time of its
// last Reset (format.go).
func resetMarkKey(prefix, key string) string { return prefix + "{" + key + "}:reset" }

// candidateBanKey returns the Redis key of key's candidate ban record
// (Policy.CandidateBan).
func candidateBanKey(prefix, key string) string { return prefix + "{" + key + "}:cban" }

// stateKeys returns the script's KEYS for key under pl: the ban record,
// the record of each of pl's windows, then of each candidate window, then
// the candidate ban record when pl has a candidate ban policy, then the
// coarse records of blocks when pl counts them (blocks.go). (The names
// banKey and candidateBanKey give, cut from one string: a decision
// allocates its keys' bytes once.)
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
	// A Builder never changes the bytes it has written: each name stays
	// what it was when cut.
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

// seedKeys appends to keys (stateKeys) the records of the other periods
// sd names (registry.go).
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
