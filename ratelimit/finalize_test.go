package ratelimit

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// heartbeat returns a function that makes one heartbeat of l's.
func heartbeat(t *testing.T, l *Limiter) func() {
	return func() {
		t.Helper()
		if err := l.replicas.beat(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// olderReplicaBeats makes a heartbeat of a replica of the release before
// f's limiter: in the census every release writes, not in this release's.
func olderReplicaBeats(t *testing.T, f *fixture) {
	t.Helper()
	if err := f.rdb.ZAdd(context.Background(), f.l.opts.Prefix+"{replicas}", redis.Z{Score: float64(f.clk.Now().UnixMilli()), Member: "older"}).Err(); err != nil {
		t.Fatal(err)
	}
}

// The finalize mark's life on a replica, read by its heartbeat: refused
// while an older release's replica is live, in force once set, out of
// force again when an older replica appears (a rollback begun without
// undoing it), when undone, or when no heartbeat has read it for
// heartbeatTTL.
func TestFinalizeComesIntoForce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	l, ctx := f.l, context.Background()
	beat := heartbeat(t, l)
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

	olderReplicaBeats(t, f)
	beat()
	if got := testenv.MetricValue(t, l.met.olderReplicas); got != 1 {
		t.Fatalf("older_replicas %v, want 1", got)
	}
	var refused *OlderReplicasError
	if _, _, err := l.Finalize(ctx); !errors.As(err, &refused) || refused.Count != 1 {
		t.Fatalf("finalize with an older replica live: %v", err)
	}
	if st, err := l.Finalization(ctx); err != nil || !st.Finalized.IsZero() || st.Older != 1 || st.Replicas != 2 {
		t.Fatalf("status %+v %v", st, err)
	}

	// Gone (silent for the census's TTL): finalizing goes through.
	f.clk.Add(heartbeatTTL + time.Millisecond)
	at, already, err := l.Finalize(ctx)
	if err != nil || already || !at.Equal(f.clk.Now()) {
		t.Fatalf("finalize: %v %v %v, want at %v, not already", at, already, err, f.clk.Now())
	}
	inForce(false, "finalized, before a heartbeat read it")
	beat()
	inForce(true, "finalized, read by a heartbeat")
	// Compact records are written.
	if got := l.replicas.finalized(); got != compactRecords {
		t.Fatalf("the script's argument %v, want %v", got, compactRecords)
	}
	if st, err := l.Finalization(ctx); err != nil || !st.Finalized.Equal(at) || st.Older != 0 {
		t.Fatalf("status %+v %v", st, err)
	}

	// Finalizing again (a hook after every upgrade) keeps the mark.
	f.clk.Add(time.Second)
	if again, already, err := l.Finalize(ctx); err != nil || !already || !again.Equal(at) {
		t.Fatalf("finalize again: %v %v %v, want the mark of %v kept", again, already, err, at)
	}

	// A rollback begun without undoing it: out of force at the next
	// heartbeat, with a warning.
	olderReplicaBeats(t, f)
	beat()
	inForce(false, "an older replica live again")
	if !strings.Contains(f.logs.String(), "replicas of an older release are live") {
		t.Fatalf("no warning logged: %s", f.logs)
	}
	if got := testenv.MetricValue(t, l.met.finalizeMark); got != 1 {
		t.Fatalf("finalize_mark %v with the mark set and out of force, want 1", got)
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
	if got := testenv.MetricValue(t, l.met.finalizeMark); got != 0 {
		t.Fatalf("finalize_mark %v once undone, want 0", got)
	}

	// Not read for heartbeatTTL: out of force without a heartbeat.
	if _, _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	inForce(true, "finalized again")
	// A failed heartbeat (Redis restarting, say) leaves the view in force
	// until it lapses, as a slow one would: compact records too.
	f.mini.SetError("LOADING Redis is loading the dataset in memory")
	if err := l.replicas.beat(ctx, time.Second); err == nil {
		t.Fatal("a heartbeat succeeded on a failing Redis")
	}
	f.mini.SetError("")
	inForce(true, "a heartbeat failed")
	if got := l.replicas.finalized(); got != compactRecords {
		t.Fatalf("after a failed heartbeat, the script's argument %v, want compact records kept", got)
	}
	if l.replicas.grantsBlocks() {
		t.Fatal("blocks granted after a failed heartbeat")
	}
	v := *l.replicas.view.Load()
	v.until = time.Now().UnixNano()
	l.replicas.view.Store(&v)
	if l.replicas.finalized() != notFinalized {
		t.Fatal("still in force after heartbeatTTL without a heartbeat")
	}
}

// A record's expiry through a replica: the end of its head's epoch plus
// the record TTL, set again by every head move, finalized or not, compact
// or a full ring. (The test lengthens the record's expiry by hand to see
// whether a decision set it again.)
func TestEveryHeadMoveSetsTheExpiry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// finalize: never (0), before the first decision (1), between the
		// first and second of the first epoch (2).
		finalize int
	}{{"never", 0}, {"before", 1}, {"mid-epoch", 2}} {
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
				if _, _, err := l.Finalize(ctx); err != nil {
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
				if tc.finalize == 2 && e == 0 {
					f.clk.Add(100 * time.Millisecond)
					finalize()
				}
				// Three buckets on, then twenty (a full ring's short move,
				// then a long one): the head moves, within the epoch.
				for _, buckets := range []int64{3, 20} {
					if err := f.rdb.PExpireAt(ctx, key, time.UnixMilli(long)).Err(); err != nil {
						t.Fatal(err)
					}
					f.clk.Add(time.Duration(buckets*r.gran) * time.Microsecond)
					f.allow(t, "k", p)
					if got := expiry(); got != want {
						t.Fatalf("epoch %d, a head move of %d buckets within it: expiry %d ms, want it set again to %d (not left at %d)", e, buckets, got, want, long)
					}
				}
			}
		})
	}
}

// Blocks come into force with finalizing (finalize.go): not beside a
// replica of an earlier release, even one that finalized records under its
// own census and mark, in force once the mark is set and read by a
// heartbeat, a cold key's requests then spent from blocks; a rollback
// begun without undoing them stops new blocks while coarse records are
// still read; undone, coarse records are read until the last block
// granted may have ended.
func TestBlocksComeIntoForceWithFinalizing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	l, ctx := f.l, context.Background()
	beat := heartbeat(t, l)
	state := func(grant, read bool, what string) {
		t.Helper()
		gauge := testenv.MetricValue(t, l.met.blocksInForce)
		if l.blocksOn() != grant || (l.hooks.blocks || l.replicas.readsCoarse()) != read || (gauge == 1) != grant {
			t.Fatalf("%s: blocks in force %v (gauge %v), coarse records read %v; want %v, %v", what, l.blocksOn(), gauge, (l.hooks.blocks || l.replicas.readsCoarse()), grant, read)
		}
	}
	join := func(census, member string) {
		t.Helper()
		if err := f.rdb.ZAdd(ctx, l.opts.Prefix+census, redis.Z{Score: float64(f.clk.Now().UnixMilli()), Member: member}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	state(false, false, "before finalizing")

	// A replica of an earlier release that finalized in steps of its own:
	// in its censuses, with its marks set. None of that is this release's.
	for _, census := range []string{"{replicas}", "{replicas}:final", "{replicas}:final2", "{replicas}:final3"} {
		join(census, "previous")
	}
	for _, mark := range []string{"{replicas}:finalized", "{replicas}:finalized2", "{replicas}:finalized3"} {
		if err := f.rdb.Set(ctx, l.opts.Prefix+mark, f.clk.Now().Add(-time.Minute).UnixMicro(), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	if l.replicas.finalized() != notFinalized {
		t.Fatal("records finalized beside a replica of an earlier release")
	}
	state(false, false, "beside an earlier release that finalized its own way")
	var refused *OlderReplicasError
	if _, _, err := l.Finalize(ctx); !errors.As(err, &refused) || refused.Count != 1 {
		t.Fatalf("finalize beside a replica of the release before: %v", err)
	}
	if st, err := l.Finalization(ctx); err != nil || st.Older != 1 || !st.Finalized.IsZero() {
		t.Fatalf("status %+v %v", st, err)
	}

	// Gone: finalizing sets the mark.
	f.clk.Add(heartbeatTTL + time.Millisecond)
	at, already, err := l.Finalize(ctx)
	if err != nil || already || !at.Equal(f.clk.Now()) {
		t.Fatalf("finalize: %v %v %v, want a new mark at %v", at, already, err, f.clk.Now())
	}
	if _, already, err := l.Finalize(ctx); err != nil || !already {
		t.Fatalf("finalize again: already %v, %v", already, err)
	}
	state(false, false, "finalized, before a heartbeat read it")
	beat()
	state(true, true, "finalized, read by a heartbeat")

	// A cold key's requests: spent from blocks.
	leased := 0
	for range 200 {
		d := f.allow(t, "k", coldPlan)
		if d.Leased {
			leased++
		}
		f.clk.Add(300 * time.Millisecond)
	}
	if leased < 100 {
		t.Fatalf("%d of 200 requests of a cold key spent from blocks", leased)
	}

	// A rollback begun without undoing the mark: no new blocks at the
	// next heartbeat; coarse records still read.
	join("{replicas}", "older")
	join("{replicas}:final3", "older")
	beat()
	state(false, true, "a replica of the release before live again")
	// The alert's gauges: a rollback begun without undoing the mark.
	if older, mark := testenv.MetricValue(t, l.met.olderReplicas), testenv.MetricValue(t, l.met.finalizeMark); older != 1 || mark != 1 {
		t.Fatalf("older_replicas %v, finalize_mark %v; want 1 and 1", older, mark)
	}
	if !strings.Contains(f.logs.String(), "records are finalized but replicas of an older release are live") {
		t.Fatalf("no warning logged: %s", f.logs)
	}

	// Undone: coarse records read until blocks granted up to the last
	// heartbeat in force may have ended, then no more.
	if err := l.Unfinalize(ctx); err != nil {
		t.Fatal(err)
	}
	f.clk.Add(heartbeatTTL + time.Millisecond)
	beat()
	state(false, true, "undone, within a block's life of the last block")
	v := *l.replicas.view.Load()
	v.readUntil = time.Now().UnixNano()
	l.replicas.view.Store(&v)
	state(false, false, "undone, a block's life after the last block")
	if Unfinalizing < heartbeatTTL+blockLife+heartbeatTTL {
		t.Fatalf("Unfinalizing %v is shorter than the last block's life after the last heartbeat that saw it in force", Unfinalizing)
	}
}

// TestFinalizeMarksOutliveALostDataset: a Redis that loses its dataset
// (restarted without persistence, flushed) loses the finalize marks, and
// a heartbeat of a replica that held them in force sets them again, at
// their own times, in force again. A replica that held none restores nothing: after --undo,
// beside an older release, or one that never read them. A replica whose
// first heartbeat after the loss finds the token another wrote (a
// replica that held nothing beat first) still restores them. Undone just
// before the loss, they are restored by a replica that had not read them
// gone, and Unfinalize removes them again.
func TestFinalizeMarksOutliveALostDataset(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	l, ctx := f.l, context.Background()
	beat := heartbeat(t, l)
	marks := func() string {
		t.Helper()
		v, err := f.rdb.Get(ctx, l.replicas.mark).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return v
	}
	inForce := func(want bool, what string) {
		t.Helper()
		if got := l.replicas.finalized() != notFinalized; got != want {
			t.Fatalf("%s: records finalized %v, want %v", what, got, want)
		}
		if got := l.replicas.grantsBlocks(); got != want {
			t.Fatalf("%s: blocks in force %v, want %v", what, got, want)
		}
	}
	beat()
	if _, _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	inForce(true, "finalized")
	set := marks()

	f.clk.Add(time.Minute)
	f.mini.FlushAll()
	beat()
	if got := marks(); got != set {
		t.Fatalf("after the dataset was lost, marks %q, want %q set again", got, set)
	}
	inForce(true, "the dataset lost, the marks set again")
	if !strings.Contains(f.logs.String(), "Redis lost its data") {
		t.Fatalf("the restore was not logged: %s", f.logs)
	}

	// A replica that never read the marks beats first after the next
	// loss; the one that held them restores them at its own heartbeat.
	other, err := newLimiter(f.rdb, Options{Registerer: prometheus.NewRegistry()}, hooks{clock: f.clk.Now, noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	f.mini.FlushAll()
	heartbeat(t, other)()
	if got := marks(); got != "" {
		t.Fatalf("a replica that never held the marks set %q", got)
	}
	beat()
	if got := marks(); got != set {
		t.Fatalf("after a token written by another replica, marks %q, want %q set again", got, set)
	}

	// Beside an older release the marks are out of force: not held.
	olderReplicaBeats(t, f)
	beat()
	inForce(false, "an older replica live")
	heartbeat(t, other)()
	f.mini.FlushAll()
	beat()
	heartbeat(t, other)()
	if got := marks(); got != "" {
		t.Fatalf("marks out of force when the dataset was lost were set again: %q", got)
	}

	// Undone: not held once a heartbeat read them gone.
	f.clk.Add(heartbeatTTL + time.Millisecond)
	if _, _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	heartbeat(t, other)()
	inForce(true, "finalized again")
	if err := l.Unfinalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	heartbeat(t, other)()
	f.mini.FlushAll()
	beat()
	if got := marks(); got != "" {
		t.Fatalf("undone marks set again after the dataset was lost: %q", got)
	}

	// Undone, and the dataset lost before a heartbeat read them gone: a
	// replica restores them, and Unfinalize removes them again.
	if _, _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	set = marks()
	done := make(chan error, 1)
	go func() { done <- l.Unfinalize(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); marks() != ""; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Unfinalize did not remove the marks")
		}
	}
	f.mini.FlushAll()
	beat()
	if got := marks(); got != set {
		t.Fatalf("marks %q, want %q: restored by a replica that had not read them undone", got, set)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := marks(); got != "" {
		t.Fatalf("Unfinalize left the restored marks %q", got)
	}
}

// TestCompactRecordsComeWithFinalizing: beside a replica of an earlier
// release (one that finalized records and blocks under its own marks but
// cannot read a compact record), records are written as full rings, and
// finalizing is refused; once it is gone, finalizing sets the mark and new
// window records are compact. Unfinalize writes every compact record back
// as a full ring, keeping its counts and expiry; so does one replica after
// a rollback begun without undoing it, once new records are full again.
func TestCompactRecordsComeWithFinalizing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	l, ctx := f.l, context.Background()
	beat := heartbeat(t, l)
	compact := func(want bool, what string) {
		t.Helper()
		arg, _ := l.replicas.finalized().(string)
		got := strings.HasSuffix(arg, "c")
		if gauge := testenv.MetricValue(t, l.met.finalized); got != want || (gauge == 1) != want {
			t.Fatalf("%s: compact records %v (argument %q, gauge %v), want %v", what, got, arg, gauge, want)
		}
	}
	previous := func() {
		t.Helper()
		for _, census := range []string{"{replicas}", "{replicas}:final", "{replicas}:final2"} {
			if err := f.rdb.ZAdd(ctx, l.opts.Prefix+census, redis.Z{Score: float64(f.clk.Now().UnixMilli()), Member: "previous"}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// records reads the first byte and length of each of key's window records.
	records := func(key string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, k := range f.rdb.Keys(ctx, l.opts.Prefix+"{"+key+"}:w:*").Val() {
			out[k] = f.rdb.Get(ctx, k).Val()
		}
		if len(out) != 2 {
			t.Fatalf("%s has %d window records, want 2", key, len(out))
		}
		return out
	}
	previous()
	for _, mark := range []string{"{replicas}:finalized", "{replicas}:finalized2"} {
		if err := f.rdb.Set(ctx, l.opts.Prefix+mark, f.clk.Now().Add(-time.Minute).UnixMicro(), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	compact(false, "beside the release before")
	var refused *OlderReplicasError
	if _, _, err := l.Finalize(ctx); !errors.As(err, &refused) || refused.Count != 1 {
		t.Fatalf("finalize beside the release before: %v", err)
	}
	f.allow(t, "full", coldPlan)
	for k, rec := range records("full") {
		if rec[0] != formatVersion {
			t.Fatalf("%s written beside the release before has version %d", k, rec[0])
		}
	}

	f.clk.Add(heartbeatTTL + time.Millisecond)
	if _, already, err := l.Finalize(ctx); err != nil || already {
		t.Fatalf("finalize once the release before is gone: already %v, %v", already, err)
	}
	if st, err := l.Finalization(ctx); err != nil || !st.Finalized.Equal(f.clk.Now()) {
		t.Fatalf("status %+v %v, want finalized at %v", st, err, f.clk.Now())
	}
	beat()
	compact(true, "finalized")
	for range 3 {
		f.allow(t, "small", coldPlan)
		f.clk.Add(time.Second)
	}
	before := records("small")
	ttls := map[string]time.Duration{}
	for k, rec := range before {
		if rec[0] != compactVersion || len(rec) > 1+ringHeader+2*compactEntryBytes {
			t.Fatalf("%s of a key that sent 3 requests: version %d, %d bytes", k, rec[0], len(rec))
		}
		ttls[k] = f.rdb.PTTL(ctx, k).Val()
	}

	// expanded fails unless key's window records are full rings again,
	// with the counts, heads and expiries they had compact.
	expanded := func(key string, before map[string]string, ttls map[string]time.Duration) {
		t.Helper()
		for k, rec := range records(key) {
			vh, total, hc, ho := readRing(t, rec, windowRingAt)
			if rec[0] != formatVersion || int64(len(rec)) != 1+ringSize(int64(len(rec)-1-ringHeader)/slotBytes-1) {
				t.Fatalf("%s: version %d, %d bytes", k, rec[0], len(rec))
			}
			if bh, btotal, bhc, bho := readRing(t, before[k], windowRingAt); vh != bh || total != btotal || hc != bhc || ho != bho || total != 3 {
				t.Fatalf("%s: head %d, total %d, head count %d, offset %d; compact %d %d %d %d", k, vh, total, hc, ho, bh, btotal, bhc, bho)
			}
			if ttl := f.rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > ttls[k] {
				t.Fatalf("%s expires in %v, compact in %v", k, ttl, ttls[k])
			}
		}
	}
	if err := l.Unfinalize(ctx); err != nil {
		t.Fatal(err)
	}
	expanded("small", before, ttls)

	// Finalized again, then a rollback begun without undoing it: compact
	// records stop at the next heartbeat, and within heartbeatTTL more one
	// replica writes the compact ones back (expandFor).
	if _, _, err := l.Finalize(ctx); err != nil {
		t.Fatal(err)
	}
	beat()
	compact(true, "finalized again")
	for range 3 {
		f.allow(t, "again", coldPlan)
		f.clk.Add(time.Second)
	}
	before = records("again")
	for k, rec := range before {
		if rec[0] != compactVersion {
			t.Fatalf("%s written finalized again has version %d", k, rec[0])
		}
		ttls[k] = f.rdb.PTTL(ctx, k).Val()
	}
	previous()
	beat()
	compact(false, "a rollback begun without undoing it")
	if got := testenv.MetricValue(t, l.met.olderReplicas); got != 1 {
		t.Fatalf("older_replicas %v beside the release before, compact marked: want 1 (the alert's)", got)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		full := true
		for _, rec := range records("again") {
			full = full && rec[0] == formatVersion
		}
		if full {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("compact records not written back 10 s after an older replica appeared")
		}
	}
	expanded("again", before, ttls)
}

// An undo writes compact records back as full rings, five or six times their
// size, only while Redis keeps a fifth of its maxmemory free: short of room,
// it stops with errExpandRoom and leaves Redis writable for the fleet's own
// decisions; with room, it writes them all back.
func TestUndoKeepsRedisRoom(t *testing.T) {
	t.Parallel()
	const maxMemory = 16 << 20
	s := startRedisServer(t, "--maxmemory", strconv.Itoa(maxMemory), "--maxmemory-policy", "noeviction")
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	l, err := newLimiter(rdb, Options{Prefix: "undo:", Timeout: time.Second}, hooks{noHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })

	// 30,000 quiet minute windows, compact: a head and no entries. As full
	// rings (1,225 bytes each) they would take over twice maxmemory.
	r := newRing(10, time.Minute, 200)
	head := time.Now().UnixMicro() / r.gran
	rec := string([]byte{compactVersion}) + string(binary.BigEndian.AppendUint64(nil, uint64(head))) +
		string(binary.BigEndian.AppendUint32(nil, 1)) + string(binary.BigEndian.AppendUint32(nil, 1)) + "\x00\x01"
	const keys = 30_000
	for from := 0; from < keys; from += 1000 {
		pipe := rdb.Pipeline()
		for i := from; i < from+1000; i++ {
			pipe.Set(ctx, windowKey(l.opts.Prefix, "k"+strconv.Itoa(i), &r), rec, 10*time.Minute)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// forms counts the window records by their version byte.
	forms := func() map[byte]int {
		t.Helper()
		n := map[byte]int{}
		pipe := rdb.Pipeline()
		iter := rdb.Scan(ctx, 0, "undo:{*}:w:*", 1000).Iterator()
		for iter.Next(ctx) {
			pipe.GetRange(ctx, iter.Val(), 0, 0)
		}
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			n[c.(*redis.StringCmd).Val()[0]]++
		}
		return n
	}

	err = l.Unfinalize(ctx)
	if !errors.Is(err, errExpandRoom) {
		t.Fatalf("undo with room for under half of the full rings: %v, want errExpandRoom", err)
	}
	m := readMemory(ctx, rdb)
	used, most := m.used, m.limit()
	got := forms()
	t.Logf("%v; %d of %d bytes used; %d full rings, %d compact", err, used, most, got[formatVersion], got[compactVersion])
	if most != maxMemory || used > most-most/10 {
		t.Fatalf("Redis uses %d of its maxmemory %d bytes after the undo: less than a tenth left", used, most)
	}
	if got[formatVersion] < keys/10 || got[compactVersion] < keys/10 || got[formatVersion]+got[compactVersion] != keys {
		t.Fatalf("records after an undo short of room: %v, want some of the %d written back and some left", got, keys)
	}
	if err := rdb.Set(ctx, "undo:probe", strings.Repeat("x", 1000), time.Minute).Err(); err != nil {
		t.Fatalf("Redis refuses a write after the undo: %v", err)
	}

	// No maxmemory: room up to the machine's memory (many GB here).
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unfinalize(ctx); err != nil {
		t.Fatalf("undo with no maxmemory: %v", err)
	}
	if got := forms(); got[formatVersion] != keys {
		t.Fatalf("records after an undo with room: %v, want all %d full rings", got, keys)
	}
}

// Without a maxmemory, Redis may use at most the machine's memory.
func TestMemoryFieldsReadTheLimit(t *testing.T) {
	for _, c := range []struct {
		info        string
		used, limit int64
		full        bool
	}{
		{"# Memory\r\nused_memory:1000\r\ntotal_system_memory:8000\r\nmaxmemory:4000\r\n", 1000, 4000, false},
		{"# Memory\r\nused_memory:1000\r\ntotal_system_memory:8000\r\nmaxmemory:0\r\n", 1000, 8000, false},
		{"# Memory\r\nused_memory:1000\r\n", 1000, 0, false},
		{"", 0, 0, false},
		// Full within 1% of maxmemory, under noeviction only: other
		// policies evict, and without a maxmemory nothing refuses writes.
		{"used_memory:3961\r\nmaxmemory:4000\r\nmaxmemory_policy:noeviction\r\n", 3961, 4000, true},
		{"used_memory:3960\r\nmaxmemory:4000\r\nmaxmemory_policy:noeviction\r\n", 3960, 4000, false},
		{"used_memory:4100\r\nmaxmemory:4000\r\nmaxmemory_policy:allkeys-lru\r\n", 4100, 4000, false},
		{"used_memory:9000\r\nmaxmemory:0\r\ntotal_system_memory:8000\r\nmaxmemory_policy:noeviction\r\n", 9000, 8000, false},
	} {
		m := memoryFields(c.info)
		if m.used != c.used || m.limit() != c.limit || m.full() != c.full {
			t.Errorf("%q: used %d, limit %d, full %v; want %d, %d, %v", c.info, m.used, m.limit(), m.full(), c.used, c.limit, c.full)
		}
	}
}
