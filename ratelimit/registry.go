package ratelimit

import (
	"cmp"
	"context"
	_ "embed"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A changed period keeps a key's counts. Each window's record is named by
// its period, so a plan edit that changes a period (1m to 2m, a new 1h
// window beside a day) gives the window a new record; without more, that
// record would start empty, and a key would get a fresh quota. Instead,
// the first decision that finds a key without a record for one of its
// windows, while the plan's periods are changing, starts the record from
// the key's record of another period (seed in lua/ring.lua): the shortest
// period that covers the new one, else the longest shorter one, among the
// plan's other windows and the periods the plan had lately.
//
// Which periods a plan had lately is fleet knowledge: a replica started
// after the edit never saw the old plan. So every replica marks, each
// registryEvery, the periods of the policies it decided under lately in
// one Redis hash (field NAME/PERIOD, value "first:last", Redis times in
// ms), and reads back all of them. A period stays listed while a record of
// it may exist: its period after it was last marked. Only a window whose
// period the fleet first used less than a period (and registryGrace) ago
// takes its past from other records: once a window has existed for a
// whole period, every admission it has to count was counted in it. A plan
// whose name has no other period listed, or whose periods are all older
// than that, passes nothing: the common case costs nothing.
//
// While an edit spreads, replicas on the old plan and on the new one
// disagree on a period, and each would count its admissions only in its
// own plan's records. So a period the registry lists as in use (some
// replica decided under a policy with it within registryRecent) that a
// plan lacks is enforced beside the plan's own windows, at the largest
// limit marked for it, wherever the key has a record of it (a transition
// window): every admission fits, and counts in, every window of both
// plans whose record the key has, in both directions, so the key is held
// to the stricter of the two plans until the old one is out of use
// everywhere (a few seconds after the edit reached the last replica).

const (
	registryEvery = time.Second
	// registryRecent is how long a policy counts as in use after its last
	// decision here: a replica stops marking an edited plan's old periods
	// this long after the edit reached it, and the others stop enforcing
	// them beside the new plan's a refresh later.
	registryRecent = 3 * time.Second
	// registryGrace is how long beyond its period a new window still
	// takes its past from other records: the time an edit takes to reach
	// every replica, and the replicas' markings to be read.
	registryGrace = time.Minute
)

// registryScript (lua/registry.lua) marks each field ARGV[i] (NAME/PERIOD)
// with the server's time and the limit ARGV[i+1] in the hash KEYS[1],
// drops the fields whose records are gone, and returns the server's time
// (ms), then per field its name, first and last marking (ms) and the
// largest limit marked for it lately.
var registryScript = redis.NewScript(registryLua)

//go:embed lua/registry.lua
var registryLua string

// registry is this replica's view of the periods each policy name had
// lately across the fleet.
type registry struct {
	rdb  redis.UniversalClient
	key  string
	view atomic.Pointer[registryView]
}

// registryView is one reading of the registry.
type registryView struct {
	at      int64              // Redis time of the reading, ms
	periods map[string][]regAt // by policy name
}

// regAt is one period (µs) of a policy name, when it was first and last
// marked (ms), and the largest limit marked for it lately.
type regAt struct {
	period, first, last, limit int64
}

func newRegistry(rdb redis.UniversalClient, prefix string) *registry {
	return &registry{rdb: rdb, key: prefix + "{periods}"}
}

// refresh marks the periods of plans and reads the registry back.
func (g *registry) refresh(ctx context.Context, plans []*plan) error {
	var fields []any
	for _, pl := range plans {
		for _, r := range pl.windows {
			fields = append(fields, pl.name+"/"+strconv.FormatInt(r.period, 10), r.limit)
		}
	}
	res, err := registryScript.Run(ctx, g.rdb, []string{g.key}, fields...).Slice()
	if err != nil {
		return err
	}
	v := &registryView{periods: make(map[string][]regAt)}
	if len(res) > 0 {
		v.at, _ = res[0].(int64)
	}
	for i := 1; i+3 < len(res); i += 4 {
		f, _ := res[i].(string)
		first, ok1 := res[i+1].(int64)
		last, ok2 := res[i+2].(int64)
		limit, ok3 := res[i+3].(int64)
		cut := strings.LastIndexByte(f, '/')
		if !ok1 || !ok2 || !ok3 || cut < 0 {
			continue
		}
		p, err := strconv.ParseInt(f[cut+1:], 10, 64)
		if err != nil {
			continue
		}
		v.periods[f[:cut]] = append(v.periods[f[:cut]], regAt{period: p, first: first, last: last, limit: limit})
	}
	g.view.Store(v)
	return nil
}

// run refreshes the registry every registryEvery with the plans decided
// under lately.
func (g *registry) run(ctx context.Context, timeout time.Duration, recent func() []*plan) {
	t := time.NewTicker(registryEvery)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		_ = g.refresh(rctx, recent())
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// seeding returns where pl's windows may take their past from, or nil
// when the fleet has listed no other period for pl's name lately.
func (g *registry) seeding(pl *plan) *seeding {
	if g == nil {
		return nil
	}
	v := g.view.Load()
	if v == nil {
		return nil
	}
	if c := pl.seed.Load(); c != nil && c.view == v {
		return c.s
	}
	var others []other
	var young []int64
	listed := v.periods[pl.name]
	for _, e := range listed {
		if !slices.ContainsFunc(pl.windows, func(r ring) bool { return r.period == e.period }) {
			// A period some replica decides under now (it marked it within
			// registryRecent and a refresh) is enforced beside the plan's
			// own while the edit spreads.
			o := other{period: e.period}
			if e.last+(registryRecent+registryEvery).Milliseconds() > v.at && e.limit > 0 {
				o.limit = e.limit
			}
			others = append(others, o)
		}
	}
	for _, r := range pl.windows {
		i := slices.IndexFunc(listed, func(e regAt) bool { return e.period == r.period })
		// Not listed yet (this replica just took the plan up) is young.
		if i < 0 || (listed[i].first+r.period/1000+registryGrace.Milliseconds() > v.at) {
			young = append(young, r.period)
		}
	}
	s := newSeeding(pl, others, young)
	pl.seed.Store(&seedCache{view: v, s: s})
	return s
}

// seedCache is a plan's seeding for one registry view.
type seedCache struct {
	view *registryView
	s    *seeding
}

// seeding is what a plan takes from the fleet's other periods for its
// name (others): where each young window may take its past from when the
// key has no record of it (the plan's other windows and others, in the
// order seedSource prefers them, at most maxSeedTries each), and the
// others some replica decides under now, enforced beside the plan's own
// windows while a plan edit spreads, where the key has a record of them
// (transition windows). The script's extra arguments (nums) and the
// records of the other periods (extra, after the plan's own in KEYS),
// then the coarse records of those short enough to have had blocks
// (coarse, blocks.go): a window's count is both records', so both are
// read where one is.
type seeding struct {
	extra  []ring
	coarse []ring
	nums   []int64
}

// rings returns the records sd seeds from (none for nil), the coarse ones
// last.
func (sd *seeding) rings() []ring {
	if sd == nil {
		return nil
	}
	return append(slices.Clip(sd.extra), sd.coarse...)
}

// other is a period the fleet listed for a plan's name that the plan does
// not have, with the limit to enforce it at while the edit spreads (0:
// not in use any more).
type other struct {
	period, limit int64
}

const maxSeedTries = 4

func newSeeding(pl *plan, others []other, young []int64) *seeding {
	if len(others) == 0 {
		return nil
	}
	slices.SortFunc(others, func(a, b other) int { return cmp.Compare(a.period, b.period) })
	s := &seeding{}
	type source struct {
		keyIndex int64 // 1-based, in the script's KEYS
		r        ring
		// The period's coarse record as the script reads it: KEYS index
		// (0: none; the script finds the plan's own windows'), g, n, unit.
		coarse [4]int64
	}
	var srcs []source
	for i, r := range pl.windows {
		srcs = append(srcs, source{keyIndex: int64(2 + i), r: r})
	}
	for i, o := range others {
		r := newRing(max(o.limit, 1), time.Duration(o.period)*time.Microsecond, pl.buckets)
		s.extra = append(s.extra, r)
		srcs = append(srcs, source{keyIndex: int64(pl.keyCount() + 1 + i), r: r})
	}
	// A short window (one a block could be of: plan.split) of another
	// plan may have a coarse record: read beside its own.
	for i := range others {
		src := &srcs[len(pl.windows)+i]
		if src.r.gran >= blockLife.Microseconds() {
			continue
		}
		c := blockRing(src.r)
		src.coarse = [4]int64{int64(pl.keyCount() + 1 + len(others) + len(s.coarse)), c.gran, c.n, c.unit}
		s.coarse = append(s.coarse, c)
	}
	s.nums = append(s.nums, int64(len(srcs)))
	for _, src := range srcs {
		s.nums = append(s.nums, src.keyIndex, src.r.period, src.r.gran, src.r.n, src.r.unit)
		s.nums = append(s.nums, src.coarse[:]...)
	}
	for i := range pl.windows {
		r := &pl.windows[i]
		var try []int64
		for j, src := range srcs {
			if src.r.period != r.period && slices.Contains(young, r.period) {
				try = append(try, int64(j+1))
			}
		}
		slices.SortStableFunc(try, func(a, b int64) int {
			pa, pb := srcs[a-1].r.period, srcs[b-1].r.period
			switch {
			case betterSource(r, pa, pb):
				return -1
			case betterSource(r, pb, pa):
				return 1
			}
			return 0
		})
		if len(try) > maxSeedTries {
			try = try[:maxSeedTries]
		}
		s.nums = append(s.nums, int64(len(try)))
		s.nums = append(s.nums, try...)
	}
	var trans [][]int64
	for i, o := range others {
		if o.limit > 0 {
			r, src := &s.extra[i], &srcs[len(pl.windows)+i]
			trans = append(trans, append([]int64{src.keyIndex, r.limit, r.period, r.gran, r.n, r.unit, r.ttlMS}, src.coarse[:]...))
		}
	}
	if len(young) == 0 && len(trans) == 0 {
		return nil
	}
	s.nums = append(s.nums, int64(len(trans)))
	for _, t := range trans {
		s.nums = append(s.nums, t...)
	}
	return s
}

// seedKeys's records follow the plan's own in KEYS (stateKeys), after the
// candidate windows'.

// numbers returns the script's extra per-call numbers for sd (none for nil).
func (sd *seeding) numbers() []int64 {
	if sd == nil {
		return nil
	}
	return sd.nums
}
