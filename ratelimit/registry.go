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

// The period registry keeps a key's counts through a plan edit that changes a
// period. Records are named by period, so a new period's record would start
// empty: a fresh quota. Instead a young window without a record is seeded from
// another period's, and a period still in use elsewhere is enforced beside the
// new plan's until the edit has spread.

// Every replica marks, each registryEvery, the periods it decided under in one
// hash (NAME/PERIOD: "first:last:limit", Redis ms), listed while a record of
// them may exist: a replica started after an edit never saw the old plan.
// Seeding (seed in lua/ring.lua) takes the shortest period covering the window,
// else the longest shorter one, among the plan's other windows and the listed
// periods. Only a window first marked less than a period and registryGrace ago
// is seeded: an older one has counted all it must. A transition window, a
// listed period the plan lacks marked within registryRecent, is enforced at its
// largest marked limit where the key has its record: every admission fits and
// counts in both plans' windows, holding the key to the stricter plan while
// replicas disagree.

const (
	registryEvery = time.Second
	// registryRecent is how long after its last decision here a policy's
	// periods count as in use, enforced beside an edited plan's.
	registryRecent = 3 * time.Second
	// registryGrace is how long past its period a new window may be seeded:
	// time for an edit to reach every replica and their marks to be read.
	registryGrace = time.Minute
)

// registryScript (lua/registry.lua) marks each field ARGV[i] (NAME/PERIOD) in
// the hash KEYS[1] with the server's time and limit ARGV[i+1], drops fields
// whose records are gone, and returns the server's time (ms), then per field
// its name, first and last marking (ms) and largest recent limit.
var registryScript = redis.NewScript(registryLua)

//go:embed lua/registry.lua
var registryLua string

// registry is this replica's view of the periods each policy name had lately.
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

// regAt is a name's period (µs): first and last marked (ms), largest limit.
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

// run refreshes the registry every registryEvery with the plans decided lately.
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

// seeding returns what pl's windows take from other periods (nil: none listed).
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
			// Marked within registryRecent and a refresh: a transition window.
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

// seeding is what a plan takes from its name's other periods: each young
// window's sources (in seedSource's order, at most maxSeedTries) and the
// transition windows. nums are the script's extra numbers, extra the other
// periods' records, then coarse their coarse records where short: a window
// counts both.
type seeding struct {
	extra  []ring
	coarse []ring
	nums   []int64
}

// rings returns the records sd seeds from (none for nil), coarse ones last.
func (sd *seeding) rings() []ring {
	if sd == nil {
		return nil
	}
	return append(slices.Clip(sd.extra), sd.coarse...)
}

// other is a listed period the plan lacks, and its limit while in use (0: not).
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
		// The period's coarse record as the script reads it: KEYS index (0:
		// none; the script finds the plan's own windows'), g, n, unit.
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
	// Another plan's short window (plan.split) may have a coarse record too.
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

// numbers returns the script's extra per-call numbers for sd (none for nil).
func (sd *seeding) numbers() []int64 {
	if sd == nil {
		return nil
	}
	return sd.nums
}

// betterSource reports whether a record of period p stands better than one of
// q for r's past (seedSource, newSeeding): one covering r's period before one
// that does not; of two covering it the shorter (finer buckets), else the longer.
func betterSource(r *ring, p, q int64) bool {
	switch pc, qc := p >= r.period, q >= r.period; {
	case pc != qc:
		return pc
	case pc:
		return p < q
	default:
		return p > q
	}
}
