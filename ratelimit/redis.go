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

// stateKeys returns the Redis keys of key's window state and ban state.
// The braces make Redis Cluster hash only the key itself, so both land in
// one slot and one script can touch them.
func stateKeys(prefix, key string) []string {
	return []string{prefix + "{" + key + "}:w", prefix + "{" + key + "}:b"}
}

// scriptArgs returns the full ARGV for one evaluation: the per-call
// numbers packed in one string, then the plan's arguments.
func scriptArgs(pl *plan, mode, extra int64, ask leaseAsk) []any {
	var b [40]byte
	for i, v := range [5]int64{mode, extra, ask.want, ask.need, ask.life} {
		binary.BigEndian.PutUint64(b[8*i:], uint64(v))
	}
	args := make([]any, 0, 1+len(pl.argv))
	args = append(args, string(b[:]))
	return append(args, pl.argv...)
}

// replyFields is the number of 8-byte integers in the script's reply
// before the per-window ones (three each).
const replyFields = 9

// decode turns the script's reply (8-byte big-endian integers, see
// script.go) into a verdict.
func decode(pl *plan, reply any) (verdict, error) {
	s, ok := reply.(string)
	if !ok || len(s) != 8*(replyFields+3*len(pl.windows)) {
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
		win:      make([]winVerdict, len(pl.windows)),
	}
	for i := range v.win {
		k := replyFields + 3*i
		v.win[i] = winVerdict{used: at(k), remaining: at(k + 1), reset: at(k + 2)}
	}
	return v, nil
}

// isNoScript reports whether err says the server does not know the script
// (after SCRIPT FLUSH, a restart or a failover).
func isNoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || strings.Contains(err.Error(), "NOSCRIPT"))
}
