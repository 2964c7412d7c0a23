package ratelimit

// This file holds the decision algorithm as plain Go. It is the reference
// for the Lua script (script.go), which implements the same steps on a
// packed string, and it is what the limiter runs in memory when there is no
// shared store or the store cannot be reached. Times are integers in µs.

// ringState is the in-memory form of one ring.
type ringState struct {
	head  int64   // newest bucket the ring covers
	total int64   // sum of count
	count []int64 // per slot: events in the bucket
	off   []int64 // per slot: last event's offset from the bucket start, in units (rounded up)
}

func newRingState(r *ring) ringState {
	return ringState{count: make([]int64, r.n+1), off: make([]int64, r.n+1)}
}

// bucket returns the bucket index for now, never before the ring's head,
// so a clock stepping back cannot reopen old buckets.
func (s *ringState) bucket(r *ring, now int64) int64 { return max(now/r.gran, s.head) }

// advance moves the head to bucket b, dropping buckets that no interval of
// length period ending in b can reach.
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
				i := j % (r.n + 1)
				if c := s.count[i]; c > 0 {
					s.total = max(s.total-c, 0)
					s.count[i] = 0
				}
			}
		}
	}
	s.head = b
}

// last returns the (rounded up) time of bucket j's last event; without
// offsets, the bucket's end.
func (s *ringState) last(r *ring, j int64) int64 {
	if r.obytes == 0 {
		return (j + 1) * r.gran
	}
	return j*r.gran + s.off[j%(r.n+1)]*r.unit
}

// until returns when bucket j stops counting: when the head has moved
// n+1 buckets past it, or earlier, once it is the oldest bucket and its
// last event is a full period old.
func until(r *ring, j, last int64) int64 {
	return min(max(last+r.period, (j+r.n)*r.gran), (j+r.n+1)*r.gran)
}

// used returns how many events count at now (head at b) and the first
// bucket that still counts.
func (s *ringState) used(r *ring, now, b int64) (int64, int64) {
	j0 := b - r.n
	if c0 := s.count[j0%(r.n+1)]; c0 > 0 && s.last(r, j0)+r.period <= now {
		return s.total - c0, j0 + 1
	}
	return s.total, j0
}

// retry returns when enough buckets, oldest first, have stopped counting
// to drop excess events.
func (s *ringState) retry(r *ring, from, b, excess int64) int64 {
	var acc int64
	for j := from; j <= b; j++ {
		if c := s.count[j%(r.n+1)]; c > 0 {
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
		if s.count[j%(r.n+1)] > 0 {
			return until(r, j, s.last(r, j))
		}
	}
	return now
}

// add records k events at time at in bucket b (the head). The bucket's
// last-event time only grows: a lease records its end, which later
// admissions in the same bucket must not move back.
func (s *ringState) add(r *ring, b, at, k int64) {
	i := b % (r.n + 1)
	off := ceilDiv(max(at-b*r.gran, 0), r.unit)
	if s.count[i] > 0 {
		off = max(off, s.off[i])
	}
	s.count[i] = min(s.count[i]+k, r.cap)
	s.off[i] = off
	s.total = min(s.total+k, r.cap)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// keyState is everything stored for one key.
type keyState struct {
	layout    string
	windows   []ringState
	slayout   string
	strikes   ringState
	banUntil  int64
	offences  int64
	offenceAt int64
	expires   int64 // when all of the state is worthless (µs)
}

// winVerdict is one window's standing after a decision.
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
}

// leaseAsk asks a decision to count want admissions at once (a lease)
// when every window has at least need of them remaining, to be spent
// within life µs and before the current bucket of any window ends. A
// want of 1 or less asks for the request alone.
type leaseAsk struct {
	want, need, life int64
}

// noLease asks for one admission.
var noLease = leaseAsk{want: 1, need: 1, life: 1}

// decide evaluates one request (peek: only report) for the key whose state
// is st, at now, recording extra earlier rejections as strikes. An
// admission counts ask.want admissions when the lease is granted.
func (st *keyState) decide(pl *plan, now int64, peek bool, extra int64, ask leaseAsk) verdict {
	if st.layout != pl.layout || len(st.windows) != len(pl.windows) {
		st.layout = pl.layout
		st.windows = st.windows[:0]
		for i := range pl.windows {
			st.windows = append(st.windows, newRingState(&pl.windows[i]))
		}
	}
	if st.slayout != pl.slayout {
		st.slayout = pl.slayout
		st.strikes = ringState{}
		if pl.ban {
			st.strikes = newRingState(&pl.strikes)
		}
	}
	v := verdict{now: now, win: make([]winVerdict, len(pl.windows))}
	offences := st.offences
	if offences > 0 && st.offenceAt+pl.memory <= now {
		offences = 0
	}
	banned := pl.ban && st.banUntil > now

	var bk [8]int64
	buckets := bk[:0]
	var fr [8]int64
	froms := fr[:0]
	admit := !banned
	room, end := int64(-1), now+ask.life
	for i := range pl.windows {
		r, s := &pl.windows[i], &st.windows[i]
		b := s.bucket(r, now)
		s.advance(r, b)
		c, from := s.used(r, now, b)
		buckets, froms = append(buckets, b), append(froms, from)
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
			st.windows[i].add(&pl.windows[i], buckets[i], at, granted)
		}
		st.expires = max(st.expires, now+pl.stateMS*1000)
		v.granted, v.leaseEnd = granted, end
	}

	if pl.ban {
		r, s := &pl.strikes, &st.strikes
		b := s.bucket(r, now)
		s.advance(r, b)
		k := extra
		if !admit && !banned {
			k++
		}
		if !peek && !banned && k > 0 {
			s.add(r, b, now, k)
			if c, _ := s.used(r, now, b); c > r.limit {
				offences = min(offences+1, offenceCap)
				st.offenceAt = now
				st.banUntil = now + pl.banLength(offences)
				clear(s.count)
				s.total = 0
				banned, v.newBan = true, true
			}
			st.offences = offences
			st.expires = max(st.expires, st.banUntil, st.offenceAt+pl.memory, (b+r.n+1)*r.gran)
		}
		v.strikes, _ = s.used(r, now, b)
		v.offences = offences
		if st.banUntil > now {
			v.banUntil = st.banUntil
		}
	}

	admitted := admit && !peek
	for i := range pl.windows {
		r, s := &pl.windows[i], &st.windows[i]
		w := &v.win[i]
		if admitted {
			w.used += granted
		}
		w.remaining = max(r.limit-w.used, 0)
		w.reset = s.reset(r, froms[i], buckets[i], w.used, now)
		if !admit && w.used >= r.limit {
			if t := s.retry(r, froms[i], buckets[i], w.used-r.limit+1) - now; t > v.retry {
				v.retry = t
			}
		}
	}
	switch {
	case banned:
		v.outcome, v.retry = Banned, st.banUntil-now
	case !admit:
		v.outcome = Limited
	default:
		v.outcome, v.retry = Allowed, 0
	}
	return v
}
