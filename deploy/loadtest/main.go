// Command loadtest is petstore's load-test kit: it drives a deployment
// (normally `make cluster`) with the scenarios users and SREs care about,
// checks every response's rate-limit fields, and prints a summary with
// thresholds on latency and on check rates. It exits 1 when a threshold
// fails, so it can gate a pipeline.
//
// Scenarios, run together:
//
//	steady       constant arrival rate over many keys within their limits,
//	             optionally ramped up from 0 (-ramp)
//	retry-after  a client that exceeds its limit and honours Retry-After:
//	             admitted on its first retry, never banned
//	abusive      a key that ignores 429s: banned, and key_banned's
//	             Retry-After is the rest of the ban
//	burst        after steady, many requests at once across the keys
//
// Keys come from CSV files as `petstore keys create --count N --format
// csv` prints them (id,key,plan,label). Reset them first (`petstore limits
// reset --plan P`): the checks assume no earlier traffic in the window.
// Against replicas that lease admissions, -remaining-held and
// -remaining-lease-life allow the rise of Remaining that leasing bounds
// (riseAllowed).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "loadtest: %v\n", err)
		os.Exit(1)
	}
}

// config is the kit's flags.
type config struct {
	url        string
	keysFile   string
	tinyFile   string
	rate       float64
	duration   time.Duration
	ramp       time.Duration
	workers    int
	burst      int
	tinyLimit  int
	tinyPeriod time.Duration
	tinyBan    time.Duration
	retries    int
	p95, p99   time.Duration
	burstP99   time.Duration
	checkRate  float64
	short      bool
	// The Remaining check's slack (riseAllowed): held, half the most a
	// fleet can have counted for one key and not spent; leaseLife, the
	// longest an answer counts down from one count, which adds what the
	// run sends one key in that time.
	held      int64
	leaseLife time.Duration
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.url, "url", "", "base URL of the service, e.g. http://127.0.0.1:18080 (required)")
	fs.StringVar(&c.keysFile, "keys", "", "CSV of keys for steady and burst load, on a plan with room for the rate (required)")
	fs.StringVar(&c.tinyFile, "tiny-keys", "", "CSV of at least two keys on a small plan with bans, for retry-after and abusive (optional)")
	fs.Float64Var(&c.rate, "rate", 1000, "steady arrival rate, requests/s")
	fs.DurationVar(&c.duration, "duration", 30*time.Second, "steady duration")
	fs.DurationVar(&c.ramp, "ramp", 0, "steady: the arrival rate rises linearly from 0 to -rate over this much of -duration, "+
		"so a deployment just started warms its connections and caches as traffic grows (every answer is still checked)")
	fs.IntVar(&c.workers, "workers", 256, "most requests in flight; an arrival finding none free is counted as dropped")
	fs.IntVar(&c.burst, "burst", 1000, "requests sent at once after the steady load")
	fs.IntVar(&c.tinyLimit, "tiny-limit", 5, "the tiny plan's limit")
	fs.DurationVar(&c.tinyPeriod, "tiny-period", 10*time.Second, "the tiny plan's period")
	fs.DurationVar(&c.tinyBan, "tiny-ban", 30*time.Second, "the tiny plan's first ban (0: do not check its length)")
	fs.IntVar(&c.retries, "retries", 2, "how many times the retry-after client exceeds its limit and waits")
	fs.DurationVar(&c.p95, "p95", 50*time.Millisecond, "threshold: 95th percentile latency of steady requests")
	fs.DurationVar(&c.p99, "p99", 200*time.Millisecond, "threshold: 99th percentile latency of steady requests")
	fs.DurationVar(&c.burstP99, "burst-p99", 500*time.Millisecond, "threshold: 99th percentile latency of burst requests (all sent at once, so they queue)")
	fs.Float64Var(&c.checkRate, "check-rate", 0.999, "threshold: least fraction of each load check that passes (scenario checks must all pass)")
	fs.Int64Var(&c.held, "remaining-held", 0, "the Remaining check's slack for a fleet with leases: half the most its replicas can have counted for one key "+
		"and not spent (petstore: replicas x 2 x --ratelimit-max-lease); the check allows twice this; 0 checks that Remaining never rises")
	fs.DurationVar(&c.leaseLife, "remaining-lease-life", 0, "with -remaining-held: the longest an answer counts down from one count (petstore: a block's 10s); "+
		"the check also allows what this run sends one key in that time, which an answer from an older count does not count")
	fs.BoolVar(&c.short, "short", false, "a short run for CI: 300/s for 5s, a burst of 200, one retry")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.short {
		c.rate, c.duration, c.burst, c.retries = 300, 5*time.Second, 200, 1
	}
	switch {
	case c.url == "":
		return c, errors.New("-url is required")
	case c.keysFile == "":
		return c, errors.New("-keys is required")
	case c.rate <= 0 || c.duration <= 0 || c.workers < 1 || c.burst < 0:
		return c, errors.New("-rate, -duration and -workers must be positive, -burst not negative")
	case c.ramp < 0 || c.ramp >= c.duration:
		return c, errors.New("-ramp must be shorter than -duration, and not negative")
	case c.tinyLimit < 1 || c.tinyPeriod <= 0 || c.tinyBan < 0 || c.retries < 1:
		return c, errors.New("-tiny-limit, -tiny-period and -retries must be positive, -tiny-ban not negative")
	case c.checkRate < 0 || c.checkRate > 1:
		return c, errors.New("-check-rate is a fraction between 0 and 1")
	case c.held < 0 || c.leaseLife < 0:
		return c, errors.New("-remaining-held and -remaining-lease-life must not be negative")
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	keys, err := readKeys(cfg.keysFile)
	if err != nil {
		return err
	}
	var tiny []key
	if cfg.tinyFile != "" {
		if tiny, err = readKeys(cfg.tinyFile); err != nil {
			return err
		}
		if len(tiny) < 2 {
			return fmt.Errorf("%s: the retry-after and abusive scenarios need two keys, found %d", cfg.tinyFile, len(tiny))
		}
	}
	k := newKit(cfg, len(keys), stderr)
	if err := k.learnWindows(ctx, append(slices.Clone(keys), tiny...)); err != nil {
		return err
	}
	report := k.run(ctx, keys, tiny)
	failed := report.print(stdout, cfg)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if failed > 0 {
		return fmt.Errorf("%d threshold(s) failed", failed)
	}
	return nil
}

// riseAllowed is how far one key's Remaining may rise above an earlier
// answer, for keys keys (README, "The Remaining allowance"). Every answer
// counts down from a count Redis made (the round trip that decided it, or
// granted the lease or block it spends, or its replica's last one for an
// answer decided without Redis), so a later answer rises above an earlier
// one by what Redis took back between their counts, or, when the later
// one's count is the older, by what Redis counted between them: at most
// what the fleet can have counted and not spent at one time (2H: per
// replica a lease or block held, a lease and a block in flight, and one
// give-back on its way) plus the key's requests over a block's life D
// (its share of the steady rate and of the burst). Without
// -remaining-held, none.
func riseAllowed(c config, keys int) int64 {
	if c.held == 0 {
		return 0
	}
	n := 2 * c.held
	if c.leaseLife > 0 && keys > 0 {
		n += int64(math.Ceil(c.rate*c.leaseLife.Seconds()/float64(keys))) + int64((c.burst+keys-1)/keys)
	}
	return n
}
