package ratelimit

import (
	"errors"
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

// scriptArgs returns the full ARGV for one evaluation.
func scriptArgs(pl *plan, mode, extra int64, ask leaseAsk) []any {
	args := make([]any, 0, 5+len(pl.argv))
	args = append(args, mode, extra, ask.want, ask.need, ask.life)
	return append(args, pl.argv...)
}

// decode turns the script's reply into a verdict.
func decode(pl *plan, reply any) (verdict, error) {
	vals, ok := reply.([]any)
	if !ok || len(vals) != 9+3*len(pl.windows) {
		return verdict{}, fmt.Errorf("ratelimit: unexpected script reply %T (%d values)", reply, len(vals))
	}
	var ints [9]int64
	for i := range ints {
		if ints[i], ok = vals[i].(int64); !ok {
			return verdict{}, fmt.Errorf("ratelimit: unexpected script reply value %T", vals[i])
		}
	}
	v := verdict{
		outcome:  Outcome(ints[0]),
		retry:    ints[1],
		now:      ints[2],
		newBan:   ints[3] == 1,
		strikes:  ints[4],
		banUntil: ints[5],
		offences: ints[6],
		granted:  ints[7],
		leaseEnd: ints[8],
		win:      make([]winVerdict, len(pl.windows)),
	}
	for i := range v.win {
		u, ok1 := vals[9+3*i].(int64)
		r, ok2 := vals[10+3*i].(int64)
		t, ok3 := vals[11+3*i].(int64)
		if !ok1 || !ok2 || !ok3 {
			return verdict{}, errors.New("ratelimit: unexpected script reply window values")
		}
		v.win[i] = winVerdict{used: u, remaining: r, reset: t}
	}
	return v, nil
}

// isNoScript reports whether err says the server does not know the script
// (after SCRIPT FLUSH, a restart or a failover).
func isNoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || strings.Contains(err.Error(), "NOSCRIPT"))
}
