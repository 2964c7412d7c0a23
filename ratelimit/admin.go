package ratelimit

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WindowUsage is one window's standing for a key.
type WindowUsage struct {
	Window
	// Used is how many admitted requests the window counts now.
	Used      int64
	Remaining int64
	// Reset is when the counted requests have all slid out.
	Reset time.Time
}

// Usage is a key's standing under a policy.
type Usage struct {
	Windows []WindowUsage
	// Candidate is the standing of the policy's candidate windows.
	Candidate []WindowUsage
	// Strikes, BannedUntil and Offences of Policy.CandidateBan.
	CandidateStrikes     int64
	CandidateBannedUntil time.Time
	CandidateOffences    int64
	// Strikes is the number of rejected requests counted toward a ban.
	Strikes int64
	// BannedUntil is when the current ban ends; zero when not banned.
	BannedUntil time.Time
	// Offences is the number of bans remembered for escalation.
	Offences int64
	// Degraded: Redis was unreachable; the figures are this process's own.
	Degraded bool
}

// Usage reports key's standing under p without counting a request.
func (l *Limiter) Usage(ctx context.Context, key string, p Policy) (Usage, error) {
	pl, err := l.plans.get(&p, &l.opts, l.met)
	if err != nil {
		return Usage{}, err
	}
	now := l.now().UnixMicro()
	var v verdict
	degraded := false
	switch {
	case l.rdb == nil:
		v = l.local.store.decide(key, pl, now, input{peek: true, lease: noLease})
	default:
		err := ErrUnavailable
		if !l.breaker.isOpen() {
			var reply string
			sd := l.reg.seeding(pl)
			// Coarse records too: another replica's blocks may be in force.
			cp := l.replicas.callPlan(pl, true)
			keys := seedKeys(l.opts.Prefix, key, sd, stateKeys(l.opts.Prefix, key, cp))
			d := decision{keys: keys, pl: cp, nums: scriptNums(pl, input{peek: true, lease: noLease, seed: sd})}
			if reply, err = l.batch.do(ctx, d, l.opts.Timeout); err == nil {
				err = decodeInto(pl, reply, &v)
			}
		}
		if err != nil {
			if l.opts.FailureMode == FailClosed {
				return Usage{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			v, degraded = l.fb.decide(key, pl, now, input{peek: true, lease: noLease}), true
		}
	}
	u := Usage{Strikes: v.strikes, Offences: v.offences, Degraded: degraded, Windows: make([]WindowUsage, len(pl.policy.Windows))}
	if v.banUntil > 0 {
		u.BannedUntil = time.UnixMicro(v.banUntil)
	}
	for i, w := range pl.policy.Windows {
		u.Windows[i] = WindowUsage{Window: w, Used: v.win[i].used, Remaining: v.win[i].remaining, Reset: time.UnixMicro(v.win[i].reset)}
	}
	for i, w := range pl.policy.Candidate {
		u.Candidate = append(u.Candidate, WindowUsage{Window: w, Used: v.cwin[i].used, Remaining: v.cwin[i].remaining, Reset: time.UnixMicro(v.cwin[i].reset)})
	}
	u.CandidateStrikes, u.CandidateOffences = v.cStrikes, v.cOffences
	if v.cBanUntil > 0 {
		u.CandidateBannedUntil = time.UnixMicro(v.cBanUntil)
	}
	return u, nil
}

// Unban lifts key's ban and forgets its strikes and offences, the candidate ban
// policy's too. Every replica drops its cached ban at once through pub/sub
// (within banRevalidate if the announcement is lost).
func (l *Limiter) Unban(ctx context.Context, key string) error {
	l.local.store.unban(key)
	if l.rdb == nil {
		return nil
	}
	l.fb.unban(key)
	if l.cache != nil {
		l.cache.forget(key)
	}
	ctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	defer cancel()
	if err := l.rdb.Del(ctx, banKey(l.opts.Prefix, key), candidateBanKey(l.opts.Prefix, key)).Err(); err != nil {
		return fmt.Errorf("ratelimit: unban %q: %w", key, err)
	}
	if err := l.rdb.Publish(ctx, l.opts.Prefix+"unban", key).Err(); err != nil {
		return fmt.Errorf("ratelimit: announce unban of %q: %w", key, err)
	}
	return nil
}

// Reset forgets key's counts, strikes, ban and offences under p (older periods'
// records expire). Replicas drop their cache, leases and blocks for key on
// Unban's announcement, giving nothing back; until it arrives (if missed, until
// they end: 1 s for a lease, 10 s for a block) those are spent uncounted.
func (l *Limiter) Reset(ctx context.Context, key string, p Policy) error {
	pl, err := l.plans.get(&p, &l.opts, l.met)
	if err != nil {
		return err
	}
	l.local.store.forget(key)
	if l.rdb == nil {
		return nil
	}
	l.fb.forget(key)
	if l.cache != nil {
		l.cache.forget(key)
	}
	if l.lease != nil {
		l.lease.forget(key)
	}
	ctx, cancel := context.WithTimeout(ctx, max(l.opts.Timeout, time.Second))
	defer cancel()
	// Periods the plan had lately go too: a later decision would seed from
	// them.
	if err := resetRecords(ctx, l.rdb, l.opts.Prefix, key, pl, l.reg.seeding(pl)); err != nil {
		return fmt.Errorf("ratelimit: reset %q: %w", key, err)
	}
	if err := l.rdb.Publish(ctx, l.opts.Prefix+"unban", key).Err(); err != nil {
		return fmt.Errorf("ratelimit: announce reset of %q: %w", key, err)
	}
	return nil
}

// resetRecords deletes key's records under pl and those sd seeds from, and
// marks the key reset at the server's time: a give-back of a grant from before
// takes nothing (giveback.go). The mark lives as long as the longest record
// would have: by then no bucket from before the Reset lies in any window, and a
// give-back takes only from buckets a window holds. A later Reset takes the
// later time and the longer life.
func resetRecords(ctx context.Context, rdb redis.Cmdable, prefix, key string, pl *plan, sd *seeding) error {
	// The coarse records too: another replica's blocks may be in force.
	if pl.blk != nil {
		pl = pl.blk
	}
	var ttl int64
	for _, rs := range [][]ring{pl.windows, pl.candidates, sd.rings(), pl.coarse} {
		for i := range rs {
			ttl = max(ttl, rs[i].ttlMS)
		}
	}
	keys := append([]string{resetMarkKey(prefix, key)}, seedKeys(prefix, key, sd, stateKeys(prefix, key, pl))...)
	return resetScript.Run(ctx, rdb, keys, max(ttl, 1000)).Err()
}

// resetScript (lua/reset.lua) deletes KEYS[2..] and sets the reset mark KEYS[1]
// to the server's time (µs), to live ARGV[1] ms or longer if it had more left.
var resetScript = redis.NewScript(resetLua)

//go:embed lua/reset.lua
var resetLua string
