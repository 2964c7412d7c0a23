// Command soak runs make cluster's fleet (replicas of `petstore serve`
// behind HAProxy, sharing a Redis) for a long time at about half its
// capacity, restarts Redis and rolls the replicas now and then, and
// fails when something grows that should not, or when a client sees a
// 5xx outside a fault.
//
// The fleet is deploy/local/cluster.sh's, in a state directory and on
// ports of the soak's own, on a private redis-server the soak starts
// (never the machine's), pets in memory and keys in its static keys
// file: -keys keys on the built-in plans (keyMix), added beside the
// script's own. The soak measures the capacity first (-probe of requests
// back to back), resets the fleet (Redis restarted empty, the replicas
// rolled), then sends -load of that (or -rate) as an open model through
// HAProxy. Every -fault-every (a run shorter than two gets one, at its
// middle: newSchedule) it rolls the replicas one at a time (SIGTERM,
// start, /readyz, back in HAProxy's rotation, as a rolling update does),
// then kills Redis and starts it empty. Every -sample-every it reads
// each replica's resident memory, Go heap in use and heap goal and
// goroutines (its /metrics), its descriptors and connections (/proc),
// and Redis's used_memory, key count and full window records among 500
// random keys (drawn only), into soak.csv; soak.svg draws
// them and summary.txt holds the verdict, all in a directory of their
// own under -dir.
//
// It fails when a judged series grows more than -max-growth percent
// from the first steady interval to the last, or within one
// (judgeGrowth says exactly how, replicaColumns which series and why),
// when a request gets a 5xx
// or no answer outside a fault's window (from the fault's start until
// the fleet is as before, plus -grace), or when the fleet does not
// recover from a fault within a minute.
//
// Standard library only, a module of its own like deploy/loadtest, so
// that the service's go.mod stays as it is. Linux: it reads /proc.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
}

// config is the soak's flags.
type config struct {
	duration    time.Duration
	faultEvery  time.Duration
	warmup      time.Duration
	grace       time.Duration
	sampleEvery time.Duration
	replicas    int
	keys        int
	load        float64
	rate        float64
	probe       time.Duration
	workers     int
	maxGrowth   float64
	petstore    string
	script      string
	dir         string
	port        int
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&c.duration, "duration", time.Hour, "how long the steady load runs")
	fs.DurationVar(&c.faultEvery, "fault-every", 10*time.Minute, "time between faults (a roll of the replicas, then Redis restarted empty); "+
		"a run shorter than twice this gets one fault, at its middle; 0: none")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Minute, "samples not judged after the load starts and after each fault's window "+
		"(at most a quarter of the time between faults)")
	fs.DurationVar(&c.grace, "grace", 5*time.Second, "how long a fault's window lasts after the fleet is ready again")
	fs.DurationVar(&c.sampleEvery, "sample-every", 10*time.Second, "time between samples of the series")
	fs.IntVar(&c.replicas, "replicas", 3, "replicas behind HAProxy")
	fs.IntVar(&c.keys, "keys", 10000, "API keys the load is spread over, on the built-in plans")
	fs.Float64Var(&c.load, "load", 0.5, "the steady rate as a fraction of the capacity measured first")
	fs.Float64Var(&c.rate, "rate", 0, "the steady rate in requests/s (0: -load of the measured capacity)")
	fs.DurationVar(&c.probe, "probe", 5*time.Second, "how long the capacity is measured, after a second's start")
	fs.IntVar(&c.workers, "workers", 256, "most requests in flight; an arrival finding none free is counted as dropped")
	fs.Float64Var(&c.maxGrowth, "max-growth", 5, "most a series may grow from the first steady interval to the last, or within one, in percent")
	fs.StringVar(&c.petstore, "petstore", "../../bin/petstore", "the petstore binary the replicas run (make build)")
	fs.StringVar(&c.script, "cluster-script", "../local/cluster.sh", "make cluster's script")
	fs.StringVar(&c.dir, "dir", "../../.soak", "where each run gets a directory of its own (CSV, SVG, summary, the fleet's logs)")
	fs.IntVar(&c.port, "port", 0, "the fleet's base port, as cluster.sh's PORT (0: a free range)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.duration <= 0 || c.faultEvery < 0 || c.warmup < 0 || c.grace < 0 || c.sampleEvery <= 0 || c.probe <= 0:
		return c, errors.New("-duration, -sample-every and -probe must be positive; -fault-every, -warmup and -grace not negative")
	case c.replicas < 1 || c.workers < 1:
		return c, errors.New("-replicas and -workers must be positive")
	case c.keys < 20 || c.keys > 100000:
		return c, errors.New("-keys must be from 20 (one key of every plan) to 100000")
	case c.load <= 0 || c.load > 1 || c.rate < 0:
		return c, errors.New("-load is a fraction in (0, 1]; -rate not negative")
	case c.maxGrowth < 0:
		return c, errors.New("-max-growth must not be negative")
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	for _, tool := range []string{"redis-server", "haproxy", "curl", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not on PATH: install Debian's package (make services installs redis-server and haproxy)", tool)
		}
	}
	for _, p := range []*string{&cfg.petstore, &cfg.script, &cfg.dir} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if _, err := os.Stat(cfg.petstore); err != nil {
		return fmt.Errorf("no petstore binary: %w (make build writes bin/petstore)", err)
	}
	s, err := newSoak(cfg, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	rep, err := s.run(ctx)
	if err != nil {
		return err
	}
	text := rep.String()
	fmt.Fprint(stdout, text)
	if err := os.WriteFile(filepath.Join(s.dir, "summary.txt"), []byte(text), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nresults: %s (soak.csv, soak.svg, summary.txt; the fleet's logs in cluster/)\n", s.dir)
	if failed := rep.failures(); len(failed) > 0 {
		return fmt.Errorf("FAIL: %s", failed)
	}
	return nil
}
