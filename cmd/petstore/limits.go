package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/config"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/postgres"
	"github.com/animal-store/petstore/ratelimit"
)

// limiter opens the rate limiter as a command uses it; close releases it
// and its Redis client.
func (c *call) limiter() (l *ratelimit.Limiter, close func(), err error) {
	// A command-line tool should wait for an answer, not fall back: its
	// calls get seconds, not a request's deadline.
	timeout := max(c.cfg.Redis.Timeout, 2*time.Second)
	c.cfg.Redis.Timeout = timeout
	rdb, err := c.cfg.Redis.NewRedisClient()
	if err != nil {
		return nil, nil, c.usage(err)
	}
	if rdb == nil {
		return nil, nil, c.usageErrorf("limits are kept in Redis: set --redis-url or PETSTORE_REDIS_URL (or --redis-addrs)")
	}
	// (Admin: a command is no replica; 'finalize --wait' may run for
	// minutes, and the replicas size their shares by the census.)
	l, err = ratelimit.New(rdb, ratelimit.Options{Timeout: timeout, FailureMode: ratelimit.FailClosed, Admin: true})
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return l, func() { l.Close(); rdb.Close() }, nil
}

func setupLimitsShow(fs *flag.FlagSet) action {
	format := fs.String("format", "text", "output: text or json")
	return func(ctx context.Context, c *call) error {
		keyID, err := c.oneArg("KEY-ID")
		if err != nil {
			return err
		}
		if err := c.checkFormat(*format, "text", "json"); err != nil {
			return err
		}
		limiter, closeLimiter, err := c.limiter()
		if err != nil {
			return err
		}
		defer closeLimiter()
		rec, plans, err := findKey(ctx, c.cfg, keyID)
		if err != nil {
			return err
		}
		policy, err := rec.Policy(plans)
		if err != nil {
			return err
		}
		u, err := limiter.Usage(ctx, keyID, policy)
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(c.stdout, usageJSON(rec, policy, u))
		}
		printUsage(c.stdout, rec, policy, u)
		return nil
	}
}

// unban runs `limits unban KEY-ID`.
func unban(ctx context.Context, c *call) error {
	keyID, err := c.oneArg("KEY-ID")
	if err != nil {
		return err
	}
	limiter, closeLimiter, err := c.limiter()
	if err != nil {
		return err
	}
	defer closeLimiter()
	if err := limiter.Unban(ctx, keyID); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "ban lifted for %s on every replica\n", keyID)
	return nil
}

func setupLimitsReset(fs *flag.FlagSet) action {
	planName := fs.String("plan", "", "reset every key of this plan (from the keys file and the database configured)")
	return func(ctx context.Context, c *call) error {
		switch {
		case *planName != "" && len(c.args) != 0:
			return c.usageErrorf("limits reset takes key ids or --plan, not both")
		case *planName == "" && len(c.args) == 0:
			return c.usageErrorf("limits reset needs key ids or --plan")
		}
		limiter, closeLimiter, err := c.limiter()
		if err != nil {
			return err
		}
		defer closeLimiter()
		ids := c.args
		if *planName != "" {
			if ids, err = keysOfPlan(ctx, c, *planName); err != nil {
				return err
			}
		}
		for i, id := range ids {
			// A key's window records are named by its plan's windows.
			rec, plans, err := findKey(ctx, c.cfg, id)
			if err != nil {
				return fmt.Errorf("after resetting %d of %d keys: %w", i, len(ids), err)
			}
			policy, err := rec.Policy(plans)
			if err != nil {
				return fmt.Errorf("after resetting %d of %d keys: %w", i, len(ids), err)
			}
			if err := limiter.Reset(ctx, id, policy); err != nil {
				return fmt.Errorf("after resetting %d of %d keys: %w", i, len(ids), err)
			}
		}
		if *planName != "" {
			fmt.Fprintf(c.stdout, "counts, strikes and bans cleared for the %d key(s) of plan %s on every replica\n", len(ids), plan.Normalize(*planName))
		} else {
			fmt.Fprintf(c.stdout, "counts, strikes and bans cleared for %s on every replica\n", strings.Join(ids, ", "))
		}
		return nil
	}
}

func setupFinalize(fs *flag.FlagSet) action {
	undo := fs.Bool("undo", false, "hold finalizing and remove the mark, before rolling back to a release older than finalizing")
	status := fs.Bool("status", false, "print the mark, the hold and the replicas live, change nothing")
	hold := fs.Bool("hold", false, "keep the fleet from finalizing by itself (a staged upgrade whose rollback stays open)")
	release := fs.Bool("release", false, "lift a hold: the fleet finalizes by itself once no older replica is live")
	wait := fs.Duration("wait", 0, "while replicas of an older release are live or Redis does not answer, try again, for at most this long (e.g. 5m, after a rollout)")
	optional := fs.Bool("optional", false, "when it cannot finalize (older replicas live, Redis not answering; after --wait), say why and exit 0: the records stay as they are, which is safe (a fresh install's hook)")
	return func(ctx context.Context, c *call) error {
		switch {
		case len(c.args) != 0:
			return c.noArgs()
		case count(*undo, *status, *hold, *release) > 1:
			return c.usageErrorf("give one of --hold, --release, --undo and --status")
		case *wait < 0:
			return c.usageErrorf("--wait must not be negative, got %s", *wait)
		case (*wait > 0 || *optional) && count(*undo, *status, *hold, *release) > 0:
			return c.usageErrorf("--wait and --optional go with finalizing, not with --hold, --release, --undo or --status")
		}
		limiter, closeLimiter, err := c.limiter()
		if err != nil {
			return err
		}
		defer closeLimiter()
		if *hold || *release {
			if err := limiter.Hold(ctx, *hold); err != nil {
				return err
			}
			if *hold {
				fmt.Fprintln(c.stdout, "finalizing held: the fleet does not finalize by itself until 'petstore limits finalize --release' or 'petstore limits finalize'")
			} else {
				fmt.Fprintln(c.stdout, "hold lifted: the fleet finalizes by itself once no replica of an older release has been live for the replicas' finalize period")
			}
			return nil
		}
		err = finalize(ctx, limiter, *undo, *status, *wait, c.stdout, c.stderr)
		var nf *notFinalizedError
		if *optional && errors.As(err, &nf) {
			fmt.Fprintf(c.stdout, "%v; the records stay as they are (safe, only dearer): finalize later with 'petstore limits finalize'\n", err)
			return nil
		}
		return err
	}
}

// finalize runs 'limits finalize': it marks the rate limiter's records as
// finalized (ratelimit.Limiter.Finalize), removes the mark (undo), or
// prints it (status). Refused because replicas of an older release are
// live, or failing to reach Redis, it tries again every finalizeRetry for
// up to wait, saying on stderr what it waits for whenever that changes: a
// replica leaves the census a heartbeat's TTL after its last heartbeat, so
// a finalize run as soon as a rollout reports done may find the last old
// pods still counted, and a hook Job may start before Redis answers it.
func finalize(ctx context.Context, limiter *ratelimit.Limiter, undo, status bool, wait time.Duration, stdout, stderr io.Writer) error {
	switch {
	case status:
		st, err := limiter.Finalization(ctx)
		if err != nil {
			return err
		}
		if !st.Held.IsZero() {
			fmt.Fprintf(stdout, "finalizing held since %s\n", st.Held.UTC().Format(time.RFC3339Nano))
		}
		if st.Finalized.IsZero() {
			fmt.Fprintf(stdout, "not finalized; %d replica(s) live, %d of an older release\n", st.Replicas, st.Older)
		} else {
			fmt.Fprintf(stdout, "finalized at %s; %d replica(s) live, %d of an older release\n", st.Finalized.UTC().Format(time.RFC3339Nano), st.Replicas, st.Older)
		}
		return nil
	case undo:
		if err := limiter.Unfinalize(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "finalize mark removed and finalizing held; within %s every replica has stopped reserving blocks and every block has ended, and compact records are full rings again: wait that long before starting an older release\n", ratelimit.Unfinalizing)
		return nil
	}
	deadline := time.Now().Add(wait)
	said := ""
	for {
		at, already, err := limiter.Finalize(ctx)
		if err == nil && already {
			fmt.Fprintf(stdout, "already finalized at %s (kept); no replica of an older release is live\n", at.UTC().Format(time.RFC3339Nano))
			return nil
		}
		if err == nil {
			fmt.Fprintf(stdout, "finalized at %s: within a heartbeat replicas take blocks for slow keys and write new records compact; rolling back to an older release now needs 'petstore limits finalize --undo' first\n", at.UTC().Format(time.RFC3339Nano))
			return nil
		}
		// Refused beside older replicas, or Redis failed to answer: with
		// --wait, both may pass.
		var older *ratelimit.OlderReplicasError
		if errors.As(err, &older) {
			err = fmt.Errorf("%d replica(s) of an older release live", older.Count)
		}
		switch {
		case wait == 0 && older != nil:
			return &notFinalizedError{fmt.Errorf("not finalized: %d replica(s) of an older release are live; finalize once the rollout is done (--wait 5m tries until they are gone)", older.Count)}
		case wait == 0:
			return &notFinalizedError{fmt.Errorf("not finalized: %w", err)}
		case time.Until(deadline) < finalizeRetry:
			return &notFinalizedError{fmt.Errorf("not finalized after %s: %w", wait, err)}
		}
		if msg := err.Error(); msg != said {
			fmt.Fprintf(stderr, "waiting: %s\n", msg)
			said = msg
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not finalized: %w", ctx.Err())
		case <-time.After(finalizeRetry):
		}
	}
}

// count returns how many of bs are true.
func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// notFinalizedError is finalize's answer when it could not finalize:
// replicas of an older release live, or Redis not answering, after the
// wait if any. With --optional it is said on stdout and the command
// exits 0.
type notFinalizedError struct{ err error }

func (e *notFinalizedError) Error() string { return e.err.Error() }
func (e *notFinalizedError) Unwrap() error { return e.err }

// finalizeRetry is how often 'limits finalize --wait' asks again.
const finalizeRetry = 500 * time.Millisecond

// keysOfPlan returns the ids of every key on the plan called name, from the
// static keys file and the database, whichever are configured.
func keysOfPlan(ctx context.Context, c *call, name string) ([]string, error) {
	recs, plans, err := allKeys(ctx, c.cfg)
	if err != nil {
		return nil, err
	}
	name = plan.Normalize(name)
	if _, ok := plans.Lookup(name); !ok {
		return nil, c.usageErrorf("unknown plan %q (one of %s)", name, strings.Join(plans.Names(), ", "))
	}
	if c.cfg.KeysFile == "" && c.cfg.DatabaseURL == "" {
		return nil, c.usageErrorf("--plan needs the keys: set --keys-file or --database-url (or their PETSTORE_* twins)")
	}
	var ids []string
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Plan == name && !seen[r.ID] {
			seen[r.ID] = true
			ids = append(ids, r.ID)
		}
	}
	return ids, nil
}

// allKeys returns the keys of the static keys file, then the database's.
func allKeys(ctx context.Context, cfg config.Config) ([]apikey.Record, *plan.Set, error) {
	plans, err := plan.Load(cfg.PlansFile)
	if err != nil {
		return nil, nil, err
	}
	var recs []apikey.Record
	if cfg.KeysFile != "" {
		keys, err := apikey.LoadKeys(cfg.KeysFile, plans)
		if err != nil {
			return nil, nil, err
		}
		recs = append(recs, keys.Records()...)
	}
	if cfg.DatabaseURL != "" {
		pool, err := postgres.Open(ctx, cfg.DatabaseURL, int32(cfg.DBMaxConns))
		if err != nil {
			return nil, nil, err
		}
		defer pool.Close()
		db, err := postgres.New(pool).ListKeys(ctx)
		if err != nil {
			return nil, nil, err
		}
		recs = append(recs, db...)
	}
	return recs, plans, nil
}

// findKey looks a key up by id in the static keys file, then the database.
func findKey(ctx context.Context, cfg config.Config, id string) (apikey.Record, *plan.Set, error) {
	recs, plans, err := allKeys(ctx, cfg)
	if err != nil {
		return apikey.Record{}, nil, err
	}
	for _, r := range recs {
		if r.ID == id {
			return r, plans, nil
		}
	}
	return apikey.Record{}, nil, fmt.Errorf("key %s: %w (looked in the keys file and the database configured)", id, apikey.ErrUnknown)
}

func printUsage(w io.Writer, rec apikey.Record, p ratelimit.Policy, u ratelimit.Usage) {
	fmt.Fprintf(w, "key:     %s (%s)\nplan:    %s\n", rec.ID, rec.Label, rec.Plan)
	if rec.Revoked() {
		fmt.Fprintf(w, "revoked: %s\n", rec.RevokedAt.UTC().Format(time.RFC3339))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nWINDOW\tUSED\tREMAINING\tRESETS")
	for _, win := range u.Windows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", win.Window, win.Used, win.Remaining, win.Reset.UTC().Format(time.RFC3339))
	}
	for _, win := range u.Candidate {
		fmt.Fprintf(tw, "%s (candidate)\t%d\t%d\t%s\n", win.Window, win.Used, win.Remaining, win.Reset.UTC().Format(time.RFC3339))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nstrikes: %d", u.Strikes)
	if p.Ban.Enabled() {
		fmt.Fprintf(w, " (banned after more than %d rejected requests within %s)", p.Ban.Threshold, ratelimit.FormatPeriod(p.Ban.StrikeWindow))
	}
	fmt.Fprintf(w, "\noffences remembered: %d\n", u.Offences)
	if u.BannedUntil.IsZero() {
		fmt.Fprintln(w, "ban:     none")
	} else {
		fmt.Fprintf(w, "ban:     until %s (lift it with: petstore limits unban %s)\n", u.BannedUntil.UTC().Format(time.RFC3339), rec.ID)
	}
	if b := p.CandidateBan; b.Enabled() {
		fmt.Fprintf(w, "\ncandidate strikes: %d (banned after more than %d within %s)\ncandidate offences remembered: %d\n",
			u.CandidateStrikes, b.Threshold, ratelimit.FormatPeriod(b.StrikeWindow), u.CandidateOffences)
		if u.CandidateBannedUntil.IsZero() {
			fmt.Fprintln(w, "candidate ban: none")
		} else {
			fmt.Fprintf(w, "candidate ban: until %s (measured, not enforced)\n", u.CandidateBannedUntil.UTC().Format(time.RFC3339))
		}
	}
}

// The JSON of `limits show`: the key, and its standing in the names of the
// API's GET /v1/rate_limit body, with times in RFC 3339. Names a later
// release keeps, and only adds to.
type (
	jsonUsage struct {
		ID        string     `json:"id"`
		Label     string     `json:"label"`
		Plan      string     `json:"plan"`
		Mode      string     `json:"mode"`
		RevokedAt *time.Time `json:"revokedAt"` // null: in force
		// Windows are the enforced windows, Candidate the measured ones
		// (empty: the plan has none).
		Windows   []jsonWindowUsage `json:"windows"`
		Candidate []jsonWindowUsage `json:"candidate"`
		Ban       jsonBanState      `json:"ban"`
		// CandidateBan is null when the candidate bans nothing.
		CandidateBan *jsonBanState `json:"candidateBan"`
	}
	jsonWindowUsage struct {
		Period    string    `json:"period"`
		Limit     int64     `json:"limit"`
		Used      int64     `json:"used"`
		Remaining int64     `json:"remaining"`
		Reset     time.Time `json:"reset"`
	}
	jsonBanState struct {
		Banned   bool       `json:"banned"`
		Until    *time.Time `json:"until"` // null: not banned
		Strikes  int64      `json:"strikes"`
		Offences int64      `json:"offences"`
	}
)

// usageJSON states key rec's usage u under policy p.
func usageJSON(rec apikey.Record, p ratelimit.Policy, u ratelimit.Usage) jsonUsage {
	out := jsonUsage{ID: rec.ID, Label: rec.Label, Plan: rec.Plan, Mode: "enforce",
		Windows: windowUsageJSON(u.Windows), Candidate: windowUsageJSON(u.Candidate),
		Ban: banStateJSON(u.Strikes, u.Offences, u.BannedUntil)}
	if p.Shadow {
		out.Mode = "shadow"
	}
	if rec.RevokedAt != nil {
		at := rec.RevokedAt.UTC()
		out.RevokedAt = &at
	}
	if p.CandidateBan.Enabled() {
		b := banStateJSON(u.CandidateStrikes, u.CandidateOffences, u.CandidateBannedUntil)
		out.CandidateBan = &b
	}
	return out
}

func windowUsageJSON(ws []ratelimit.WindowUsage) []jsonWindowUsage {
	out := make([]jsonWindowUsage, 0, len(ws))
	for _, w := range ws {
		out = append(out, jsonWindowUsage{Period: ratelimit.FormatPeriod(w.Period), Limit: w.Limit, Used: w.Used, Remaining: w.Remaining, Reset: w.Reset.UTC()})
	}
	return out
}

func banStateJSON(strikes, offences int64, until time.Time) jsonBanState {
	b := jsonBanState{Strikes: strikes, Offences: offences}
	if !until.IsZero() {
		at := until.UTC()
		b.Banned, b.Until = true, &at
	}
	return b
}
