package ratelimit

// The decision algorithm in memory, on the script's records (format.go), for
// a limiter without Redis and the fallback. Times are µs.

type ringState struct {
	geo   ring    // the geometry it was made for
	head  int64   // newest bucket the ring covers
	total int64   // sum of count
	count []int64 // per slot: events in the bucket
	off   []int64 // per slot: last event's offset from the bucket start, in units (rounded up)
}

func newRingState(r *ring) *ringState {
	return &ringState{geo: *r, count: make([]int64, r.n+1), off: make([]int64, r.n+1)}
}

// bucket is now's, never before the head: a clock stepping back reopens none.
func (s *ringState) bucket(r *ring, now int64) int64 { return max(now/r.gran, s.head) }

// advance moves the head to b, dropping what no interval ending in b reaches.
func (s *ringState) advance(r *ring, b int64) {
	if b <= s.head {
		return
	}
	if s.total > 0 {
		if b-s.head > r.n {
			clear(s.count)
			s.total = 0
		} else {
			for j := s.head - r.n; j <= b-r.n-1; j++ {
				i := r.slot(j)
				if c := s.count[i]; c > 0 {
					s.total = max(s.total-c, 0)
					s.count[i] = 0
				}
			}
		}
	}
	s.head = b
}

// last returns the (rounded up) time of bucket j's last event.
func (s *ringState) last(r *ring, j int64) int64 {
	return j*r.gran + s.off[r.slot(j)]*r.unit
}

// until returns when bucket j stops counting: n+1 buckets later, or once it
// is the oldest and its last event a full period old.
func until(r *ring, j, last int64) int64 {
	return min(max(last+r.period, (j+r.n)*r.gran), (j+r.n+1)*r.gran)
}

// used returns the events counting at now (head b) and the first bucket
// that counts. The oldest bucket is left out only once its last event is a
// full period old: used never undercounts an interval.
func (s *ringState) used(r *ring, now, b int64) (int64, int64) {
	j0 := b - r.n
	if c0 := s.count[r.slot(j0)]; c0 > 0 && s.last(r, j0)+r.period <= now {
		return s.total - c0, j0 + 1
	}
	return s.total, j0
}

// retry returns when enough buckets have stopped counting to drop excess.
func (s *ringState) retry(r *ring, from, b, excess int64) int64 {
	var acc int64
	for j := from; j <= b; j++ {
		if c := s.count[r.slot(j)]; c > 0 {
			acc += c
			if acc >= excess {
				return until(r, j, s.last(r, j))
			}
		}
	}
	return 0
}

// reset returns when every counted event has slid out.
func (s *ringState) reset(r *ring, from, b, used, now int64) int64 {
	if used <= 0 {
		return now
	}
	for j := b; j >= from; j-- {
		if s.count[r.slot(j)] > 0 {
			return until(r, j, s.last(r, j))
		}
	}
	return now
}

// add records k events at time at in head bucket b. A bucket's last-event
// time only grows: later admissions must not move back a lease's end.
// Counts saturate at maxCount as stored ones do (only strikes get there).
func (s *ringState) add(r *ring, b, at, k int64) {
	i := r.slot(b)
	off := ceilDiv(max(at-b*r.gran, 0), r.unit)
	if s.count[i] > 0 {
		off = max(off, s.off[i])
	}
	s.count[i] = min(s.count[i]+k, maxCount)
	s.off[i] = min(off, maxOffset)
	s.total = min(s.total+k, maxCount)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// slot is the script's j % (n + 1), never negative: near the Unix epoch an
// interval touches buckets before zero, and Go's % takes j's sign.
func (r *ring) slot(j int64) int64 {
	i := j % (r.n + 1)
	if i < 0 {
		i += r.n + 1
	}
	return i
}

// seedFrom fills s, a new ring for r with head b, from src, the key's ring of
// another period, so a period edit keeps counts. Each src bucket counting at
// now moves whole to its last event's time (or r's oldest bucket): events
// only move later, so r never counts fewer than src held within r's period.
// As seed in lua/ring.lua.
func (s *ringState) seedFrom(r *ring, b int64, src *ringState, now int64) {
	s.head = b
	sr := &src.geo
	if src.total <= 0 {
		return
	}
	for j := src.head - sr.n; j <= src.head; j++ {
		c := src.count[sr.slot(j)]
		if c <= 0 {
			continue
		}
		t := src.last(sr, j)
		if t+r.period <= now {
			continue
		}
		bj := min(max(t/r.gran, b-r.n), b)
		i := r.slot(bj)
		off := min(ceilDiv(max(t-bj*r.gran, 0), r.unit), maxOffset)
		if s.count[i] == 0 || off > s.off[i] {
			s.off[i] = off
		}
		s.count[i] = min(s.count[i]+c, maxCount)
		s.total = min(s.total+c, maxCount)
	}
}

// seedSource returns the ring that best stands for r's past: the shortest
// period covering r's (finest buckets), else the longest shorter; or nil.
func seedSource(r *ring, rings map[string]*ringState) *ringState {
	var best *ringState
	for name, s := range rings {
		if name == r.name || s.geo.period == r.period {
			continue
		}
		if best == nil || betterSource(r, s.geo.period, best.geo.period) {
			best = s
		}
	}
	return best
}

// banState is a key's ban record: ban, offences and strikes (strikeRing's).
type banState struct {
	until      int64
	offences   int64
	offenceAt  int64
	strikeRing string
	strikes    *ringState
}

// strike counts k strikes at now if record; crossing r's threshold bans the
// key (longer per remembered offence) and restarts strikes. struck is how
// many of k counted, up to the ban. As strike in lua/ban.lua.
func (bs *banState) strike(r *banRule, now, k int64, record bool, expires *int64) (newBan bool, struck, strikes, offences int64) {
	offences = bs.offences
	if offences > 0 && bs.offenceAt+r.memory <= now {
		offences = 0
	}
	sr := &r.strikes
	if bs.strikeRing != sr.name || bs.strikes == nil {
		// Strikes of another strike window do not count toward this one.
		bs.strikeRing, bs.strikes = sr.name, newRingState(sr)
	}
	s := bs.strikes
	b := s.bucket(sr, now)
	s.advance(sr, b)
	if record && k > 0 {
		c, _ := s.used(sr, now, b)
		struck = k
		if need := max(sr.limit-c+1, 1); k >= need {
			struck, newBan = need, true
		}
		s.add(sr, b, now, struck)
		if newBan {
			offences = min(offences+1, maxOffences)
			bs.offenceAt = now
			bs.until = now + r.length(offences)
			*s = *newRingState(sr)
			s.head = b
		}
		bs.offences = offences
		*expires = max(*expires, bs.until, bs.offenceAt+r.memory, now+sr.ttlMS*1000)
	}
	strikes, _ = s.used(sr, now, b)
	return newBan, struck, strikes, offences
}

// keyState is all that is stored for one key.
type keyState struct {
	windows    map[string]*ringState
	candidates map[string]*ringState // candidate windows, by ring name
	ban        banState
	cban       banState // the candidate windows' ban record (Policy.CandidateBan)
	expires    int64    // when all of the state is worthless (µs)
}

type winVerdict struct {
	used, remaining, reset int64
}

// verdict is the outcome of one evaluation, as the script returns it.
type verdict struct {
	outcome  Outcome
	retry    int64 // µs
	now      int64 // µs
	newBan   bool
	strikes  int64
	banUntil int64
	offences int64
	granted  int64 // admissions counted: 0 when not admitted, more than 1 for a lease
	leaseEnd int64 // µs; when granted > 1, the leased admissions may be spent until then
	win      []winVerdict
	// Candidate windows: outcome; requests admitted, would-be limited and
	// banned (this one and the extras before it); their ban; standings.
	cOutcome                       Outcome
	cAdm, cLim, cBan               int64
	cNewBan                        bool
	cStrikes, cBanUntil, cOffences int64
	cwin                           []winVerdict
}

// leaseAsk asks to count want admissions at once (a lease) if every window
// has need left, to be spent within life µs and before any window's current
// bucket ends. want <= 1 asks for the request alone.
type leaseAsk struct {
	want, need, life int64
}

var noLease = leaseAsk{want: 1, need: 1, life: 1}

// ringFor returns the key's record for r, new (kept only when keep) if none.
func (st *keyState) ringFor(r *ring, keep bool) (*ringState, bool) {
	if s := st.windows[r.name]; s != nil {
		return s, false
	}
	s := newRingState(r)
	if keep {
		if st.windows == nil {
			st.windows = make(map[string]*ringState)
		}
		st.windows[r.name] = s
	}
	return s, true
}

// input is what one evaluation is asked, besides deciding one request.
type input struct {
	peek  bool     // only report: record nothing
	extra int64    // rejections answered locally since, recorded as strikes
	add   []int64  // per window: admissions made locally while Redis was unreachable, recorded as made now
	lease leaseAsk // admissions to count at once
	seed  *seeding // where a window the key has no record of takes its past from (script only)
	// block asks to count a block too (script only; lease.go).
	block *blockAsk
}

// decide evaluates one request at now. Admissions made elsewhere (in.add)
// are recorded first, whatever the outcome, at most a window's limit each:
// no interval of its length held more.
func (st *keyState) decide(pl *plan, now int64, in input) verdict {
	peek, extra, ask := in.peek, in.extra, in.lease
	v := verdict{now: now, win: make([]winVerdict, len(pl.windows))}
	bs := &st.ban
	banned := pl.ban.on && bs.until > now

	rings := make([]*ringState, len(pl.windows))
	buckets := make([]int64, len(pl.windows))
	froms := make([]int64, len(pl.windows))
	admit := !banned
	room, end := int64(-1), now+ask.life
	for i := range pl.windows {
		r := &pl.windows[i]
		s, fresh := st.ringFor(r, !peek)
		rings[i] = s
		b := s.bucket(r, now)
		if fresh {
			if src := seedSource(r, st.windows); src != nil {
				s.seedFrom(r, b, src, now)
			}
		}
		s.advance(r, b)
		c, from := s.used(r, now, b)
		if i < len(in.add) && in.add[i] > 0 && !peek {
			a := min(in.add[i], r.limit)
			s.add(r, b, now, a)
			c += a
			st.expires = max(st.expires, now+r.ttlMS*1000)
		}
		buckets[i], froms[i] = b, from
		v.win[i].used = c
		if c >= r.limit {
			admit = false
		}
		if room < 0 || r.limit-c < room {
			room = r.limit - c
		}
		end = min(end, (b+1)*r.gran)
	}
	granted, at := int64(1), now
	if ask.want > 1 && room >= ask.need && room >= ask.want {
		granted, at = ask.want, end
	} else {
		end = 0
	}
	if admit && !peek {
		for i := range pl.windows {
			rings[i].add(&pl.windows[i], buckets[i], at, granted)
			st.expires = max(st.expires, now+pl.windows[i].ttlMS*1000)
		}
		v.granted, v.leaseEnd = granted, end
	}

	st.decideCandidates(pl, now, in, &v)

	if pl.ban.on {
		k := extra
		if !admit && !banned {
			k++
		}
		newBan, _, strikes, offences := bs.strike(&pl.ban, now, k, !peek && !banned, &st.expires)
		if newBan {
			banned, v.newBan = true, true
		}
		v.strikes, v.offences = strikes, offences
		if bs.until > now {
			v.banUntil = bs.until
		}
	}

	admitted := admit && !peek
	for i := range pl.windows {
		r, s := &pl.windows[i], rings[i]
		w := &v.win[i]
		if admitted {
			w.used += granted
		}
		w.remaining = max(r.limit-w.used, 0)
		w.reset = s.reset(r, froms[i], buckets[i], w.used, now)
		// A refusal waits for every full window and the ban: the true wait.
		if !admit && w.used >= r.limit {
			if t := s.retry(r, froms[i], buckets[i], w.used-r.limit+1) - now; t > v.retry {
				v.retry = t
			}
		}
	}
	switch {
	case banned:
		v.outcome, v.retry = Banned, max(v.retry, bs.until-now)
	case !admit:
		v.outcome = Limited
	default:
		v.outcome, v.retry = Allowed, 0
	}
	return v
}

// decideCandidates evaluates pl's candidate windows as the script does: they
// count what they would admit, as if enforced alone, and never refuse.
func (st *keyState) decideCandidates(pl *plan, now int64, in input, v *verdict) {
	if len(pl.candidates) == 0 {
		return
	}
	v.cwin = make([]winVerdict, len(pl.candidates))
	rings := make([]*ringState, len(pl.candidates))
	buckets := make([]int64, len(pl.candidates))
	froms := make([]int64, len(pl.candidates))
	room := int64(-1)
	for i := range pl.candidates {
		r := &pl.candidates[i]
		s := st.candidates[r.name]
		if s == nil {
			s = newRingState(r)
			if !in.peek {
				if st.candidates == nil {
					st.candidates = make(map[string]*ringState)
				}
				st.candidates[r.name] = s
			}
		}
		b := s.bucket(r, now)
		s.advance(r, b)
		c, from := s.used(r, now, b)
		rings[i], buckets[i], froms[i] = s, b, from
		v.cwin[i].used = c
		if room < 0 || r.limit-c < room {
			room = r.limit - c
		}
	}
	room = max(room, 0)
	// This request and the extras, in turn: a banned key's are refused; else
	// those that fit are admitted, the rest limited, each a strike; from the
	// strike that begins a ban on, they are refused as banned.
	cb := &st.cban
	if !in.peek {
		k := 1 + in.extra
		if pl.cban.on && cb.until > now {
			v.cBan, v.cOutcome = k, Banned
		} else {
			v.cAdm = min(k, room)
			v.cLim = k - v.cAdm
			if room <= in.extra {
				v.cOutcome = Limited
			}
			if v.cAdm > 0 {
				for i := range pl.candidates {
					rings[i].add(&pl.candidates[i], buckets[i], now, v.cAdm)
					st.expires = max(st.expires, now+pl.candidates[i].ttlMS*1000)
				}
			}
		}
	}
	if pl.cban.on {
		newBan, struck, strikes, offences := cb.strike(&pl.cban, now, v.cLim, !in.peek && v.cLim > 0, &st.expires)
		if newBan {
			v.cNewBan, v.cOutcome = true, Banned
			v.cLim, v.cBan = struck-1, v.cLim-struck+1
		}
		v.cStrikes, v.cOffences = strikes, offences
		if cb.until > now {
			v.cBanUntil = cb.until
		}
	}
	for i := range pl.candidates {
		r, w := &pl.candidates[i], &v.cwin[i]
		w.used += v.cAdm
		w.remaining = max(r.limit-w.used, 0)
		w.reset = rings[i].reset(r, froms[i], buckets[i], w.used, now)
	}
}
