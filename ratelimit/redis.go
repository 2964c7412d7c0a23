package ratelimit

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Script modes.
const (
	modeDecide int64 = 0
	modePeek   int64 = 1
)

// banKey returns the Redis key of key's ban record. The braces make
// Redis Cluster hash only the key itself, so all of a key's records land
// in one slot and one script can touch them (format.go).
func banKey(prefix, key string) string { return prefix + "{" + key + "}:ban" }

// stateKeys returns the script's KEYS for key under pl: the ban record,
// the record of each of pl's windows, then of each candidate window.
func stateKeys(prefix, key string, pl *plan) []string {
	keys := make([]string, 1, 1+len(pl.windows)+len(pl.candidates))
	keys[0] = banKey(prefix, key)
	for i := range pl.windows {
		keys = append(keys, prefix+"{"+key+"}:w:"+pl.windows[i].name)
	}
	for i := range pl.candidates {
		keys = append(keys, prefix+"{"+key+"}:c:"+pl.candidates[i].name)
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
	return keys
}

// scriptArgs returns the full ARGV for one evaluation: the per-call
// numbers packed in one string, then the plan's arguments.
func scriptArgs(pl *plan, in input) []any {
	mode := modeDecide
	if in.peek {
		mode = modePeek
	}
	b := make([]byte, 0, 8*(5+len(pl.windows)+len(in.seed.numbers())))
	for _, v := range [5]int64{mode, in.extra, in.lease.want, in.lease.need, in.lease.life} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	for i := range pl.windows {
		var a int64
		if i < len(in.add) {
			a = in.add[i]
		}
		b = binary.BigEndian.AppendUint64(b, uint64(a))
	}
	for _, v := range in.seed.numbers() {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	args := make([]any, 0, 1+len(pl.argv))
	args = append(args, string(b))
	return append(args, pl.argv...)
}

// replyFields is the number of 8-byte integers in the script's reply
// before the per-window ones (three each, candidate windows last).
const replyFields = 12

// decode turns the script's reply (8-byte big-endian integers, see
// script.go) into a verdict.
func decode(pl *plan, reply any) (verdict, error) {
	s, ok := reply.(string)
	if !ok || len(s) != 8*(replyFields+3*(len(pl.windows)+len(pl.candidates))) {
		return verdict{}, fmt.Errorf("ratelimit: unexpected script reply %T (%d bytes)", reply, len(s))
	}
	at := func(i int) int64 { return int64(binary.BigEndian.Uint64([]byte(s[8*i : 8*i+8]))) }
	v := verdict{
		outcome:  Outcome(at(0)),
		retry:    at(1),
		now:      at(2),
		newBan:   at(3) == 1,
		strikes:  at(4),
		banUntil: at(5),
		offences: at(6),
		granted:  at(7),
		leaseEnd: at(8),
		cThis:    at(9) == 1,
		cAdm:     at(10),
		cLim:     at(11),
		win:      make([]winVerdict, len(pl.windows)),
	}
	for i := range v.win {
		k := replyFields + 3*i
		v.win[i] = winVerdict{used: at(k), remaining: at(k + 1), reset: at(k + 2)}
	}
	if len(pl.candidates) > 0 {
		v.cwin = make([]winVerdict, len(pl.candidates))
		for i := range v.cwin {
			k := replyFields + 3*(len(pl.windows)+i)
			v.cwin[i] = winVerdict{used: at(k), remaining: at(k + 1), reset: at(k + 2)}
		}
	}
	return v, nil
}

// isNoScript reports whether err says the server does not know the script
// (after SCRIPT FLUSH, a restart or a failover).
func isNoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || strings.Contains(err.Error(), "NOSCRIPT"))
}
