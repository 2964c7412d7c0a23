package ratelimit

import (
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Script modes.
const (
	modeDecide int64 = 0
	modePeek   int64 = 1
	// modeReserve decides, and reserves the long windows (reserve.go).
	modeReserve int64 = 2
)

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

// scriptNums returns one decision's numbers for the script (script.go,
// ARGV[1]), packed: mode, extra strikes, the lease asked, then, unless
// all are zero and there is no seeding, the admissions to add per window,
// then the seeding numbers. The most common request (to decide, with no
// strikes, no lease, nothing to add or seed) has none: the script reads
// those defaults, and decodes five numbers fewer.
func scriptNums(pl *plan, in input) []byte {
	mode := modeDecide
	if in.peek {
		mode = modePeek
	} else if in.reserve != nil {
		mode = modeReserve
	}
	seed := in.seed.numbers()
	adds := slices.ContainsFunc(in.add, func(a int64) bool { return a != 0 })
	if mode == modeDecide && in.extra == 0 && in.lease == noLease && len(seed) == 0 && !adds {
		return nil
	}
	b := make([]byte, 0, 8*(10+len(pl.windows)+len(seed)))
	ask := [5]int64{mode, in.extra, in.lease.want, in.lease.need, in.lease.life}
	if mode == modeReserve {
		// Asked to reserve: at most max, for reserveLife; the
		// reservation's own numbers follow.
		ask = [5]int64{mode, in.extra, in.reserve.max, 1, reserveLife.Microseconds()}
	}
	for _, v := range ask {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	if mode == modeReserve {
		b = in.reserve.nums(pl, b)
	}
	if len(seed) > 0 || adds {
		for i := range pl.windows {
			var a int64
			if i < len(in.add) {
				a = in.add[i]
			}
			b = binary.BigEndian.AppendUint64(b, uint64(a))
		}
	}
	for _, v := range seed {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// decision is one decision for the script: its key's records (stateKeys,
// seedKeys) under pl, and what it is asked (scriptNums).
type decision struct {
	keys []string
	pl   *plan
	nums []byte
}

// scriptBatch caps the decisions one script call makes, so that a call
// holds Redis for well under a millisecond; a larger pipeline flush sends
// several calls.
const scriptBatch = 64

// batchCall returns the whole command of one script call that decides
// ds in order (script.go): command and name (FCALL and the function, or
// EVALSHA and the script's SHA1), the key count, every decision's keys,
// one after the other, then the arguments (appendBatchArgs, with the
// finalize argument fin). Each key
// goes as a pointer into its decision's own keys, which go-redis writes as
// the string it points to: no key is copied or boxed on its way.
func batchCall(command, name string, ds []decision, fin any) []any {
	nkeys := 0
	for i := range ds {
		nkeys += len(ds[i].keys)
	}
	// (Room for the arguments of one plan, as a batch mostly has.)
	cmd := make([]any, 0, 3+nkeys+5)
	cmd = append(cmd, command, name, nkeys)
	for i := range ds {
		for j := range ds[i].keys {
			cmd = append(cmd, &ds[i].keys[j])
		}
	}
	return appendBatchArgs(cmd, ds, fin)
}

// appendBatchArgs appends to args the ARGV of the script call that
// decides ds: the decisions' numbers, each behind its key count, plan
// index and number count; the finalize argument fin (finalize.go: when
// the records were finalized, in µs, or "0"); and each distinct plan's
// numbers and ban multipliers, once.
func appendBatchArgs(args []any, ds []decision, fin any) []any {
	nbytes := 0
	for i := range ds {
		nbytes += 24 + len(ds[i].nums)
	}
	calls := make([]byte, 0, nbytes)
	plans := make([]*plan, 0, 4)
	for i := range ds {
		d := &ds[i]
		p := slices.Index(plans, d.pl)
		if p < 0 {
			p = len(plans)
			plans = append(plans, d.pl)
		}
		calls = binary.BigEndian.AppendUint64(calls, uint64(len(d.keys)))
		calls = binary.BigEndian.AppendUint64(calls, uint64(p+1))
		calls = binary.BigEndian.AppendUint64(calls, uint64(len(d.nums)/8))
		calls = append(calls, d.nums...)
	}
	args = append(args, calls, fin)
	for _, pl := range plans {
		args = append(args, pl.argv[:]...)
	}
	return args
}

// replyFields is the number of 8-byte integers in the script's reply for
// a decision under pl (script.go): only what the plan has.
func (pl *plan) replyFields() int {
	n := 5 + 2*(len(pl.windows)+len(pl.candidates))
	if pl.ban.on {
		n += 4
	}
	if len(pl.candidates) > 0 {
		n += 4
	}
	if pl.cban.on {
		n += 4
	}
	return n
}

// shortReply reports whether a reply of n bytes for a decision under pl
// is in one of the script's short forms (script.go), and whether it holds
// the ban rule's fields (the short form) or not (the bare form). Every
// form has a length of its own: the whole reply has at least four fields
// more than the short, which has three more than the bare.
func (pl *plan) shortReply(n int) (short, banFields bool) {
	if len(pl.candidates) > 0 {
		return false, false
	}
	bare := 8 * (1 + 2*len(pl.windows))
	switch {
	case n == bare:
		return true, false
	case pl.ban.on && n == bare+8*3:
		return true, true
	}
	return false, false
}

// decodeInto turns the script's reply s for a decision under pl (8-byte
// big-endian integers, see script.go) into the caller's verdict out (left
// as it was on an error). A window's remaining is what its limit leaves
// of used.
func decodeInto(pl *plan, s string, out *verdict) error {
	if strings.HasPrefix(s, "E") {
		return fmt.Errorf("ratelimit: script: %s", s[1:])
	}
	short, banFields := pl.shortReply(len(s))
	if !short && len(s) != 8*pl.replyFields() {
		return fmt.Errorf("ratelimit: unexpected script reply (%d bytes)", len(s))
	}
	at := 0
	next := func() int64 {
		v := int64(binary.BigEndian.Uint64([]byte(s[at : at+8])))
		at += 8
		return v
	}
	v := out
	// A caller may lend the windows' slice (spendReserved: the short
	// windows' part of the whole plan's).
	buf := v.win
	if short {
		// One admission: Allowed, no wait, no lease, no new ban.
		*v = verdict{outcome: Allowed, granted: 1, now: next()}
	} else {
		*v = verdict{outcome: Outcome(next())}
		v.retry = next()
		v.now = next()
		v.granted = next()
		v.leaseEnd = next()
		banFields = pl.ban.on
		if banFields {
			v.newBan = next() == 1
		}
	}
	if banFields {
		v.strikes = next()
		v.banUntil = next()
		v.offences = next()
	}
	if len(pl.candidates) > 0 {
		v.cOutcome = Outcome(next())
		v.cAdm = next()
		v.cLim = next()
		v.cBan = next()
		if pl.cban.on {
			v.cNewBan = next() == 1
			v.cStrikes = next()
			v.cBanUntil = next()
			v.cOffences = next()
		}
	}
	window := func(r *ring) winVerdict {
		w := winVerdict{used: next()}
		w.remaining = max(r.limit-w.used, 0)
		w.reset = next()
		return w
	}
	if cap(buf) >= len(pl.windows) {
		v.win = buf[:len(pl.windows)]
	} else {
		v.win = make([]winVerdict, len(pl.windows))
	}
	for i := range v.win {
		v.win[i] = window(&pl.windows[i])
	}
	if len(pl.candidates) > 0 {
		v.cwin = make([]winVerdict, len(pl.candidates))
		for i := range v.cwin {
			v.cwin[i] = window(&pl.candidates[i])
		}
	}
	return nil
}

// isNoScript reports whether err says the server does not know the script
// (after SCRIPT FLUSH, a restart or a failover).
func isNoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || strings.Contains(err.Error(), "NOSCRIPT"))
}

// resetRecords deletes key's records under pl (and the records of the
// periods sd seeds from) and marks the key reset at the server's time, so
// that no block granted before (a lease or a reservation of a replica the
// Reset's announcement missed) is given back to the records made after
// (giveback.go). The mark lasts as long as the longest of those records
// would have: after that no bucket from before the Reset lies in any of
// their windows, and a give-back takes only from buckets a window holds
// at the server's time. A mark already there is overwritten by the later
// time and keeps the longer of the two lives.
func resetRecords(ctx context.Context, rdb redis.Cmdable, prefix, key string, pl *plan, sd *seeding) error {
	// The coarse records too, where the plan has them, whether or not
	// blocks are in force here: another replica's may be.
	if pl.blk != nil {
		pl = pl.blk
	}
	var ttl int64
	for _, rs := range [][]ring{pl.windows, pl.candidates, sd.rings(), pl.coarse} {
		for i := range rs {
			ttl = max(ttl, rs[i].ttlMS)
		}
	}
	keys := append([]string{resetMarkKey(prefix, key)}, seedKeys(prefix, key, sd, stateKeys(prefix, key, pl))...)
	return resetScript.Run(ctx, rdb, keys, max(ttl, 1000)).Err()
}

// resetScript (lua/reset.lua) deletes KEYS[2..] and sets the reset mark
// KEYS[1] to the server's time in µs, to live ARGV[1] ms or what it had
// left if more.
var resetScript = redis.NewScript(resetLua)

//go:embed lua/reset.lua
var resetLua string
