package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// soak is one run: its directory, its Redis and its fleet.
type soak struct {
	cfg   config
	sched schedule
	dir   string
	log   io.Writer
	redis *redisServer
	fleet *cluster
	files []*os.File
}

// newSoak makes the run's directory and starts its Redis; the fleet
// starts in run.
func newSoak(cfg config, log io.Writer) (*soak, error) {
	s := &soak{cfg: cfg, sched: newSchedule(cfg.duration, cfg.faultEvery, cfg.warmup), log: log}
	s.dir = filepath.Join(cfg.dir, time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	// Runs pile up under -dir, which is in the work tree: git is told to
	// leave it alone, as Python's caches tell it.
	if err := os.WriteFile(filepath.Join(cfg.dir, ".gitignore"), []byte("# make soak's runs\n*\n"), 0o644); err != nil {
		return nil, err
	}
	port := cfg.port
	if port == 0 {
		var err error
		if port, err = pickPort(cfg.replicas); err != nil {
			return nil, err
		}
	}
	redisLog, err := s.create("redis.log")
	if err != nil {
		return nil, err
	}
	if s.redis, err = startRedis(redisPort(port), s.dir, redisLog); err != nil {
		s.close()
		return nil, err
	}
	clusterLog, err := s.create("cluster.log")
	if err != nil {
		s.close()
		return nil, err
	}
	s.fleet, err = newCluster(cfg.script, filepath.Join(s.dir, "cluster"), cfg.petstore, cfg.replicas, port,
		fmt.Sprintf("redis://%s/0", s.redis.addr()), clusterLog)
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *soak) create(name string) (*os.File, error) {
	f, err := os.Create(filepath.Join(s.dir, name))
	if err == nil {
		s.files = append(s.files, f)
	}
	return f, err
}

// close stops the fleet (exactly what cluster.sh started), then Redis.
func (s *soak) close() {
	if s.fleet != nil {
		if err := s.fleet.down(); err != nil {
			s.logf("%v", err)
		}
	}
	if s.redis != nil {
		s.redis.stop()
	}
	for _, f := range s.files {
		f.Close()
	}
}

func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "[soak] "+format+"\n", args...)
}

// run starts the fleet, measures it, loads it for the run's duration
// with faults on schedule and samples it throughout. An error means the
// run could not start; a run that started always returns its report,
// whose fatal field says why it stopped early, if it did.
func (s *soak) run(ctx context.Context) (*report, error) {
	cfg := s.cfg
	s.logf("run directory %s", s.dir)
	s.logf("starting the fleet: %d replicas behind HAProxy on 127.0.0.1:%d, Redis on %s (cluster.sh's output: cluster.log)",
		cfg.replicas, s.fleet.port, s.redis.addr())
	if err := s.fleet.up(ctx); err != nil {
		return nil, err
	}
	keys, counts, err := s.fleet.addKeys(ctx, cfg.keys)
	if err != nil {
		return nil, err
	}
	s.logf("%d keys added to the keys file, every replica accepts them", len(keys))
	d := newDriver(s.fleet.url(), keys, cfg.workers)

	rep := &report{cfg: cfg, sched: s.sched, keyCounts: counts, probe: &tally{}, load: &tally{}, rate: cfg.rate}
	if rep.rate == 0 {
		const probeWorkers = 64
		s.logf("measuring capacity: %d clients back to back for %s", probeWorkers, cfg.probe)
		if rep.capacity, err = d.capacity(ctx, probeWorkers, cfg.probe, rep.probe); err != nil {
			return nil, fmt.Errorf("measuring capacity: %w", err)
		}
		rep.rate = rep.capacity * cfg.load
		s.logf("capacity %.0f requests/s; steady load %.0f/s", rep.capacity, rep.rate)
	}
	s.logf("resetting the fleet: Redis restarted empty, the replicas rolled")
	if err := s.reset(ctx); err != nil {
		return nil, fmt.Errorf("resetting the fleet: %w", err)
	}

	tl := &timeline{start: time.Now(), warmup: s.sched.warmup, grace: cfg.grace}
	rep.start = tl.start
	series, rules := seriesNames(cfg.replicas)
	csvLog, err := newCSVLog(filepath.Join(s.dir, "soak.csv"), series, tl.start)
	if err != nil {
		return nil, err
	}
	defer csvLog.Close()
	s.logf("steady load for %s: warm-up %s, faults at %v, a sample every %s", cfg.duration, s.sched.warmup, s.sched.faults, cfg.sampleEvery)

	loadCtx, stopLoad := context.WithCancel(ctx)
	stopSampling := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { d.steady(loadCtx, rep.rate, cfg.workers, rep.load) })
	var samples []sample
	var sampleErr error
	wg.Go(func() { samples, sampleErr = s.sample(ctx, stopSampling, tl, rep.load, csvLog) })

	for k, at := range s.sched.faults {
		if sleep(ctx, time.Until(tl.start.Add(at))) != nil {
			break
		}
		fr, err := s.fault(ctx, tl, k+1)
		rep.faults = append(rep.faults, fr)
		if err != nil {
			rep.fatal = fmt.Errorf("fault %d: %w", k+1, err)
			break
		}
	}
	if rep.fatal == nil {
		_ = sleep(ctx, time.Until(tl.start.Add(cfg.duration)))
	}
	if rep.fatal == nil && ctx.Err() != nil {
		rep.fatal = fmt.Errorf("interrupted at %s", clock(time.Since(tl.start)))
	}
	close(stopSampling)
	stopLoad()
	wg.Wait()
	rep.end = time.Now()
	if sampleErr != nil && rep.fatal == nil {
		rep.fatal = sampleErr
	}
	rep.samples = samples
	rep.judge(tl, series, rules)

	f, err := s.create("soak.svg")
	if err != nil {
		return nil, err
	}
	if err := writeSVG(f, samples, rep.start, rep.end, cfg.replicas); err != nil {
		return nil, err
	}
	return rep, nil
}

// fault rolls the replicas one at a time, as a rolling update does, then
// kills Redis and starts it empty; it ends when the fleet is as before
// (cluster.health). The roll comes first so that the replicas of every
// later interval have lived through a Redis restart: a replica that
// keeps something from one shows in the last interval and not in the
// first.
func (s *soak) fault(ctx context.Context, tl *timeline, n int) (faultReport, error) {
	fr := faultReport{n: n, start: time.Now()}
	w := tl.beginFault(fr.start)
	s.logf("%s fault %d: rolling the replicas, then restarting Redis", clock(fr.start.Sub(tl.start)), n)
	var err error
	if fr.rolls, err = s.roll(ctx); err != nil {
		return fr, err
	}
	if fr.redis, err = s.restartRedis(ctx); err != nil {
		return fr, err
	}
	fr.ready = time.Now()
	tl.endFault(w, fr.ready)
	s.logf("%s fault %d: the fleet is as before after %s", clock(fr.ready.Sub(tl.start)), n, fr.ready.Sub(fr.start).Round(100*time.Millisecond))
	return fr, nil
}

// reset restarts Redis empty, then rolls the replicas, so that the first
// steady interval, like every later one, follows fresh processes and a
// fresh Redis, which the capacity measurement's flat-out load has left
// no trace in; unlike the later ones, its replicas have not lived
// through a Redis restart.
func (s *soak) reset(ctx context.Context) error {
	if _, err := s.restartRedis(ctx); err != nil {
		return err
	}
	_, err := s.roll(ctx)
	return err
}

// roll stops and starts each replica in turn, waiting for the fleet to
// be as before (in rotation, ready, limiting through Redis) before the
// next, and returns how long each took.
func (s *soak) roll(ctx context.Context) ([]time.Duration, error) {
	var took []time.Duration
	for i := 1; i <= s.cfg.replicas; i++ {
		began := time.Now()
		if err := s.fleet.stopReplica(ctx, i); err != nil {
			return took, err
		}
		// cluster.sh up starts what is not running: the replica just
		// stopped, with the settings make cluster gives it.
		if err := s.fleet.up(ctx); err != nil {
			return took, err
		}
		if err := s.fleet.waitHealthy(ctx, s.redis.addr(), 30*time.Second); err != nil {
			return took, fmt.Errorf("after restarting r%d: %w", i, err)
		}
		took = append(took, time.Since(began))
	}
	return took, nil
}

// restartRedis kills Redis and starts it empty, and waits for the fleet
// to be as before.
func (s *soak) restartRedis(ctx context.Context) (time.Duration, error) {
	began := time.Now()
	if err := s.redis.restart(); err != nil {
		return 0, err
	}
	took := time.Since(began)
	// Redis lost the fleet's finalized mark with everything else: up
	// finalizes again, as make cluster did at the start (the replicas
	// would by themselves a minute later, in the middle of the next
	// steady interval).
	if err := s.fleet.up(ctx); err != nil {
		return took, err
	}
	return took, s.fleet.waitHealthy(ctx, s.redis.addr(), time.Minute)
}

// sample reads every series each -sample-every until stop closes,
// writes each sample to the CSV, and returns them all.
func (s *soak) sample(ctx context.Context, stop <-chan struct{}, tl *timeline, load *tally, csvLog *csvLog) ([]sample, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(s.cfg.sampleEvery)
	defer tick.Stop()
	var out []sample
	prevAt, prevRequests, prevFailed, prevDropped := tl.start, int64(0), int64(0), int64(0)
	lastLog := tl.start
	for {
		select {
		case <-stop:
			return out, nil
		case <-ctx.Done():
			return out, nil
		case <-tick.C:
		}
		at := time.Now()
		values, errs := readSeries(ctx, client, s.fleet.targets(), s.redis.port)
		requests, failed, dropped := load.requests.Load(), load.failed.Load(), load.dropped.Load()
		sm := sample{
			at:       at,
			phase:    tl.phaseAt(at),
			rps:      float64(requests-prevRequests) / at.Sub(prevAt).Seconds(),
			requests: requests - prevRequests,
			failed:   failed - prevFailed,
			dropped:  dropped - prevDropped,
			values:   values,
		}
		prevAt, prevRequests, prevFailed, prevDropped = at, requests, failed, dropped
		if sm.phase == phaseSteady && len(errs) > 0 {
			s.logf("%s steady, yet unread: %v", clock(at.Sub(tl.start)), errs)
		}
		if err := csvLog.write(sm); err != nil {
			return out, err
		}
		out = append(out, sm)
		if at.Sub(lastLog) >= time.Minute {
			lastLog = at
			s.logf("%s %s: %.0f requests/s, %d failed since the last sample, %d failed in all, %d arrivals dropped",
				clock(at.Sub(tl.start)), sm.phase, sm.rps, sm.failed, failed, load.dropped.Load())
		}
	}
}
