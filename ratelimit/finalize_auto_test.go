package ratelimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// A fleet finalizes by itself once its heartbeats have counted no older
// replica and no hold for FinalizeAfter, by Redis time: not a heartbeat
// sooner, and the period starts again whenever an older replica is
// counted.
func TestFleetFinalizesByItself(t *testing.T) {
	t.Parallel()
	const after = 30 * time.Second
	f := newFixture(t, Options{FinalizeAfter: after})
	l := f.l
	beat := heartbeat(t, l)
	finalized := func() bool {
		st := finalization(t, l)
		return !st.Finalized.IsZero()
	}

	beat() // the period starts
	f.clk.Add(after / 2)
	olderReplicaBeats(t, f)
	beat() // an older replica: the period starts again after it
	f.clk.Add(heartbeatTTL + time.Millisecond)
	beat() // the older replica is gone: clear from here
	clearAt := f.clk.Now()
	f.clk.Add(after - time.Millisecond)
	beat()
	if finalized() {
		t.Fatal("finalized before a whole period without an older replica")
	}
	f.clk.Add(time.Millisecond)
	beat()
	if !finalized() {
		t.Fatalf("not finalized a whole period (%v) after the older replica left at %v", after, clearAt)
	}
	if !strings.Contains(f.logs.String(), "finalized the records") {
		t.Fatalf("no log line for finalizing: %s", f.logs)
	}
	beat()
	if l.replicas.finalized() == notFinalized || !l.replicas.grantsBlocks() {
		t.Fatal("finalized by itself but not in force at the next heartbeat")
	}
}

// A hold keeps a fleet from finalizing by itself for as long as it is
// set, through a lost dataset; an operator's Finalize lifts it, and
// Unfinalize (before a rollback) sets it, so that the fleet does not
// finalize again behind the operator's back.
func TestHoldKeepsTheFleetFromFinalizing(t *testing.T) {
	t.Parallel()
	const after = 10 * time.Second
	f := newFixture(t, Options{FinalizeAfter: after})
	l, ctx := f.l, context.Background()
	beat := heartbeat(t, l)
	status := func() FinalizeStatus { return finalization(t, l) }
	beatFor := func(d time.Duration) {
		t.Helper()
		for end := f.clk.Now().Add(d); f.clk.Now().Before(end); f.clk.Add(heartbeatEvery) {
			beat()
		}
		beat()
	}

	if err := l.Hold(ctx, true); err != nil {
		t.Fatal(err)
	}
	beatFor(3 * after)
	if st := status(); !st.Finalized.IsZero() || st.Held.IsZero() {
		t.Fatalf("held for three periods: %+v, want not finalized and held", st)
	}
	if got := testenv.MetricValue(t, l.met.finalizeHold); got != 1 {
		t.Fatalf("finalize_hold %v while held, want 1", got)
	}

	// Redis loses its dataset: the heartbeat sets the hold again.
	if err := f.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	beat()
	if st := status(); st.Held.IsZero() {
		t.Fatal("the hold was not set again after a lost dataset")
	}
	beatFor(3 * after)
	if st := status(); !st.Finalized.IsZero() {
		t.Fatalf("finalized after a lost dataset despite the hold: %+v", st)
	}

	// Lifted: the fleet finalizes a period later.
	if err := l.Hold(ctx, false); err != nil {
		t.Fatal(err)
	}
	beatFor(after + heartbeatEvery)
	if st := status(); st.Finalized.IsZero() || !st.Held.IsZero() {
		t.Fatalf("hold lifted a period ago: %+v, want finalized", st)
	}

	// Undone before a rollback: held, and not finalized again by itself.
	if err := l.Unfinalize(ctx); err != nil {
		t.Fatal(err)
	}
	beatFor(3 * after)
	if st := status(); !st.Finalized.IsZero() || st.Held.IsZero() {
		t.Fatalf("after Unfinalize: %+v, want held and not finalized", st)
	}

	// An operator's Finalize goes through the hold and lifts it.
	if _, _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(); st.Finalized.IsZero() || !st.Held.IsZero() {
		t.Fatalf("after Finalize: %+v, want finalized and not held", st)
	}
}

// A replica's own finalizing checks the census and the hold again in the
// script: a hold set, or an older replica counted, between its heartbeat
// and its finalizing stops it; an operator's does not stop for a hold.
func TestFinalizingByItselfRechecksInTheScript(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	l, ctx := f.l, context.Background()
	heartbeat(t, l)()
	mark := func() bool {
		t.Helper()
		_, err := f.rdb.Get(ctx, l.replicas.mark).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}

	if err := l.Hold(ctx, true); err != nil {
		t.Fatal(err)
	}
	if res, err := runFinalize(ctx, l.replicas, true); err != nil || res[0] != 0 || res[3] != 1 || mark() {
		t.Fatalf("automatic finalizing under a hold: %v %v, mark set %v; want refused for the hold", res, err, mark())
	}
	if err := l.Hold(ctx, false); err != nil {
		t.Fatal(err)
	}
	olderReplicaBeats(t, f)
	if res, err := runFinalize(ctx, l.replicas, true); err != nil || res[0] != 0 || res[1] != 1 || mark() {
		t.Fatalf("automatic finalizing beside an older replica: %v %v; want refused", res, err)
	}
	f.clk.Add(heartbeatTTL + time.Millisecond)
	if res, err := runFinalize(ctx, l.replicas, true); err != nil || res[0] == 0 || !mark() {
		t.Fatalf("automatic finalizing with neither: %v %v; want the mark set", res, err)
	}
}

// finalization returns what l reads of the marks, the hold and the census.
func finalization(t *testing.T, l *Limiter) FinalizeStatus {
	t.Helper()
	st, err := l.Finalization(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// FinalizeAfter negative: a replica never finalizes by itself.
func TestFinalizeAfterNegativeNeverFinalizes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{FinalizeAfter: -1})
	l := f.l
	beat := heartbeat(t, l)
	for range 200 {
		beat()
		f.clk.Add(time.Second)
	}
	if st, err := l.Finalization(context.Background()); err != nil || !st.Finalized.IsZero() {
		t.Fatalf("%+v %v, want never finalized", st, err)
	}
}
