package ratelimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// The finalize mark's life on a replica, read by its heartbeat: refused
// while an older release's replica is live, in force once set, out of
// force again when an older replica appears (a rollback begun without
// undoing it), when undone, or when no heartbeat has read it for
// heartbeatTTL.
func TestFinalizeComesIntoForce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	l, ctx := f.l, context.Background()
	beat := func() {
		t.Helper()
		if err := l.replicas.beat(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	inForce := func(want bool, what string) {
		t.Helper()
		got := l.replicas.finalized() != notFinalized
		gauge := testenv.MetricValue(t, l.met.finalized)
		if got != want || (gauge == 1) != want {
			t.Fatalf("%s: finalized %v (gauge %v), want %v", what, got, gauge, want)
		}
	}
	beat()
	inForce(false, "before finalizing")

	// A replica of the release before: in the census every release
	// writes, not in this release's.
	older := func() {
		t.Helper()
		if err := f.rdb.ZAdd(ctx, l.opts.Prefix+"{replicas}", redis.Z{Score: float64(f.clk.Now().UnixMilli()), Member: "older"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	older()
	beat()
	if got := testenv.MetricValue(t, l.met.olderReplicas); got != 1 {
		t.Fatalf("older_replicas %v, want 1", got)
	}
	var refused *OlderReplicasError
	if _, err := l.Finalize(ctx); !errors.As(err, &refused) || refused.Count != 1 {
		t.Fatalf("finalize with an older replica live: %v", err)
	}
	if st, err := l.Finalization(ctx); err != nil || !st.Finalized.IsZero() || st.Older != 1 || st.Replicas != 2 {
		t.Fatalf("status %+v %v", st, err)
	}

	// Gone (silent for the census's TTL): finalizing goes through.
	f.clk.Add(heartbeatTTL + time.Millisecond)
	at, err := l.Finalize(ctx)
	if err != nil || !at.Equal(f.clk.Now()) {
		t.Fatalf("finalize: %v %v, want at %v", at, err, f.clk.Now())
	}
	inForce(false, "finalized, before a heartbeat read it")
	beat()
	inForce(true, "finalized, read by a heartbeat")
	if got, want := l.replicas.finalized(), strconv.FormatInt(at.UnixMicro(), 10); got != want {
		t.Fatalf("the script's argument %v, want %v", got, want)
	}
	if st, err := l.Finalization(ctx); err != nil || !st.Finalized.Equal(at) || st.Older != 0 {
		t.Fatalf("status %+v %v", st, err)
	}

	// A rollback begun without undoing it: out of force at the next
	// heartbeat, with a warning.
	older()
	beat()
	inForce(false, "an older replica live again")
	if !strings.Contains(f.logs.String(), "replicas of an older release are live") {
		t.Fatalf("no warning logged: %s", f.logs)
	}
	f.clk.Add(heartbeatTTL + time.Millisecond)
	beat()
	inForce(true, "the older replica gone again")

	// Undone.
	if err := l.Unfinalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	inForce(false, "undone")

	// Not read for heartbeatTTL: out of force without a heartbeat.
	if _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	inForce(true, "finalized again")
	v := l.replicas.fin.Load()
	l.replicas.fin.Store(&finState{at: v.at, arg: v.arg, until: time.Now().UnixNano()})
	if l.replicas.finalized() != notFinalized {
		t.Fatal("still in force after heartbeatTTL without a heartbeat")
	}
}

// A record's expiry through a replica: the end of its head's epoch plus
// the record TTL, set by every head move before finalizing, and once
// finalized only by a move into a new epoch, or one within an epoch that
// began before the mark. (The test lengthens the record's expiry by hand
// to see whether a decision set it again.)
func TestFinalizedReplicaSetsExpiryOncePerEpoch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// finalize: never (0), before the first decision (1), between the
		// first and second of the first epoch (2).
		finalize int
		// refreshed: whether the second decision of the first epoch, and
		// of the second, set the expiry again.
		refreshed [2]bool
	}{
		{"never", 0, [2]bool{true, true}},
		{"before", 1, [2]bool{false, false}},
		{"mid-epoch", 2, [2]bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, Options{MaxLease: 1})
			l, ctx := f.l, context.Background()
			p := perMinute(1000)
			pl := compile(p, DefaultBuckets, DefaultStrikeBuckets)
			key, r := stateKeys(l.opts.Prefix, "k", pl)[1], pl.windows[0]
			span := r.n / 4 * r.gran // an epoch, µs
			finalize := func() {
				t.Helper()
				if _, err := l.Finalize(ctx); err != nil {
					t.Fatal(err)
				}
				if err := l.replicas.beat(ctx, time.Second); err != nil {
					t.Fatal(err)
				}
			}
			expiry := func() int64 {
				t.Helper()
				v, err := f.rdb.PExpireTime(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				return v.Milliseconds()
			}
			if tc.finalize == 1 {
				finalize()
			}
			start := (f.clk.Now().UnixMicro()/span + 1) * span
			for e := range 2 {
				from := start + int64(e)*span
				want := (from+span+999)/1000 + r.ttlMS
				f.clk.Set(time.UnixMicro(from + 1_000_000))
				f.allow(t, "k", p)
				if got := expiry(); got != want {
					t.Fatalf("epoch %d, first decision: expiry %d ms, want %d", e, got, want)
				}
				long := f.clk.Now().Add(time.Hour).UnixMilli()
				if err := f.rdb.PExpireAt(ctx, key, time.UnixMilli(long)).Err(); err != nil {
					t.Fatal(err)
				}
				if tc.finalize == 2 && e == 0 {
					f.clk.Add(100 * time.Millisecond)
					finalize()
				}
				// Three buckets on: the head moves, within the epoch.
				f.clk.Add(3 * time.Duration(r.gran) * time.Microsecond)
				f.allow(t, "k", p)
				if got, again := expiry(), tc.refreshed[e]; again && got != want || !again && got != long {
					t.Fatalf("epoch %d, a head move within it: expiry %d ms; want it set again (%d): %v, or left (%d)", e, got, want, again, long)
				}
			}
		})
	}
}
