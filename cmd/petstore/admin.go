package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/config"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/postgres"
	"github.com/animal-store/petstore/ratelimit"
)

func openDB(ctx context.Context, cfg config.Config) (*pgxpool.Pool, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("this command needs PostgreSQL: set --database-url or PETSTORE_DATABASE_URL")
	}
	return postgres.Open(ctx, cfg.DatabaseURL, int32(cfg.DBMaxConns))
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var status bool
	cfg, _, _, err := loadConfig("migrate", "[--status] [flags]", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&status, "status", false, "print the applied and pending migrations, apply nothing; exit non-zero when this release cannot serve the schema (some are pending)")
	})
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if status {
		return printSchemaStatus(ctx, pool, stdout)
	}
	applied, err := postgres.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(stdout, "database schema is up to date")
		return nil
	}
	for _, m := range applied {
		fmt.Fprintf(stdout, "applied %s\n", m)
	}
	return nil
}

// printSchemaStatus lists the database's migrations against the built-in
// ones and fails, for a pipeline to stop a rollout, when this release
// cannot serve the schema.
func printSchemaStatus(ctx context.Context, pool *pgxpool.Pool, stdout io.Writer) error {
	st, err := postgres.ReadStatus(ctx, pool)
	if err != nil {
		return err
	}
	unknown := map[string]bool{}
	for _, m := range st.Unknown {
		unknown[m.Version] = true
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tMIGRATION\tAPPLIED\tNOTE")
	for _, m := range st.Applied {
		note := "-"
		if unknown[m.Version] {
			note = "newer than this release; additive"
			if !m.Additive {
				note = "newer than this release; NOT additive"
			}
		}
		fmt.Fprintf(tw, "applied\t%s\t%s\t%s\n", m.Name, m.AppliedAt.UTC().Format(time.RFC3339), note)
	}
	for _, m := range st.Pending {
		fmt.Fprintf(tw, "pending\t%s\t-\t-\n", m.Name)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := st.Err(); err != nil {
		return err
	}
	if len(st.Unknown) > 0 {
		fmt.Fprintf(stdout, "\ndatabase schema version %s is newer than this release's %s; every newer migration is additive, so this release can serve it\n", st.Version(), st.Needed)
		return nil
	}
	fmt.Fprintf(stdout, "\ndatabase schema version %s: up to date\n", st.Version())
	return nil
}

// quotaList collects repeated --quota LIMIT/PERIOD flags.
type quotaList []ratelimit.Window

func (q *quotaList) String() string { return plan.FormatQuotas(*q) }
func (q *quotaList) Set(s string) error {
	w, err := plan.ParseQuota(s)
	if err != nil {
		return err
	}
	*q = append(*q, w)
	return nil
}

const keysUsage = "create --plan PLAN [--label LABEL] [--quota LIMIT/PERIOD ...] [--candidate-quota LIMIT/PERIOD ...] [--count N] [--format text|csv|yaml] | list | revoke KEY-ID"

// maxKeysPerCreate bounds one `keys create --count`: enough for any load
// test, small enough that a typo cannot fill the key table.
const maxKeysPerCreate = 100000

func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: petstore keys %s", keysUsage)
	}
	sub, args := args[0], args[1:]
	var (
		planName, label, format string
		count                   int
		quotas, candidate       quotaList
	)
	extra := func(fs *flag.FlagSet) {
		if sub == "create" {
			fs.StringVar(&planName, "plan", "", "plan of the new key (required)")
			fs.StringVar(&label, "label", "", "who the key is for, e.g. a customer name")
			fs.Var(&quotas, "quota", "the key's own quota LIMIT/PERIOD, e.g. 5000/1m (repeatable; replaces the plan's window of that period)")
			fs.Var(&candidate, "candidate-quota", "a candidate quota LIMIT/PERIOD for the key, measured and never enforced, e.g. 200/1m (repeatable; replaces the plan's candidate window of that period)")
			fs.IntVar(&count, "count", 1, fmt.Sprintf("how many keys to create (at most %d)", maxKeysPerCreate))
			fs.StringVar(&format, "format", "text", "output: text, csv (id,key,plan,label) or yaml (entries of a static keys file); with csv or yaml and no database the keys are only generated")
		}
	}
	cfg, _, fs, err := loadConfig("keys "+sub, keysUsage, args, getenv, stderr, extra)
	if err != nil {
		return err
	}
	if sub == "create" {
		return createKeys(ctx, cfg, fs, keySpec{plan: planName, label: label, quotas: quotas, candidate: candidate, count: count, format: format}, stdout, stderr)
	}
	pool, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := postgres.New(pool)

	switch sub {
	case "list":
		recs, err := store.ListKeys(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		// QUOTAS and CANDIDATE are the key's own; "plan" means it has
		// none and goes by its plan's (a plan may have no candidate).
		fmt.Fprintln(tw, "ID\tPLAN\tQUOTAS\tCANDIDATE\tLABEL\tCREATED\tREVOKED")
		own := func(ws []ratelimit.Window) string {
			if len(ws) == 0 {
				return "plan"
			}
			return plan.FormatQuotas(ws)
		}
		for _, r := range recs {
			revoked := "-"
			if r.RevokedAt != nil {
				revoked = r.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Plan, own(r.Overrides), own(r.Candidate), r.Label, r.CreatedAt.UTC().Format(time.RFC3339), revoked)
		}
		return tw.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return errors.New("usage: petstore keys revoke KEY-ID")
		}
		rec, err := store.RevokeKey(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked %s (%s); replicas stop accepting it within %s (the key cache TTL)\n", rec.ID, rec.Label, cfg.KeyCacheTTL)
		return nil
	default:
		return fmt.Errorf("unknown keys command %q; usage: petstore keys %s", sub, keysUsage)
	}
}

// keySpec is what `keys create` was asked for.
type keySpec struct {
	plan, label, format string
	quotas, candidate   []ratelimit.Window
	count               int
}

// createKeys issues spec.count keys. With a database they are stored
// (only their hashes); without one, csv and yaml output makes it a pure
// generator for a static keys file and the load-test kit.
func createKeys(ctx context.Context, cfg config.Config, fs *flag.FlagSet, spec keySpec, stdout, stderr io.Writer) error {
	if fs.NArg() != 0 {
		return fmt.Errorf("keys create takes no arguments, got %q", fs.Args())
	}
	if spec.count < 1 || spec.count > maxKeysPerCreate {
		return fmt.Errorf("--count must be between 1 and %d, got %d", maxKeysPerCreate, spec.count)
	}
	switch spec.format {
	case "text", "csv", "yaml":
	default:
		return fmt.Errorf("--format must be text, csv or yaml, got %q", spec.format)
	}
	generateOnly := cfg.DatabaseURL == ""
	if generateOnly && spec.format == "text" {
		return errors.New("this command needs PostgreSQL: set --database-url or PETSTORE_DATABASE_URL (or give --format csv|yaml to only generate keys for a static keys file)")
	}
	plans, err := plan.Load(cfg.PlansFile)
	if err != nil {
		return err
	}
	if spec.plan == "" {
		return fmt.Errorf("--plan is required (one of %s)", strings.Join(plans.Names(), ", "))
	}
	name := plan.Normalize(spec.plan)
	// The policy check rejects an unknown plan, a per-key plan
	// (Enterprise) without quotas and two quotas of one period before
	// anything is stored.
	if _, err := plans.Policy(name, plan.Overrides{Quotas: spec.quotas, Candidate: spec.candidate}); err != nil {
		return err
	}

	var store *postgres.Store
	if !generateOnly {
		pool, err := openDB(ctx, cfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		store = postgres.New(pool)
	}
	issued := make([]issuedKey, 0, spec.count)
	for range spec.count {
		key, err := apikey.Generate()
		if err != nil {
			return err
		}
		h := apikey.Hash(key)
		rec := apikey.Record{
			ID:        apikey.IDFromHash(h),
			Hash:      h,
			Label:     spec.label,
			Plan:      name,
			Overrides: spec.quotas,
			Candidate: spec.candidate,
			CreatedAt: time.Now().UTC(),
		}
		if store != nil {
			if err := store.CreateKey(ctx, rec); err != nil {
				return fmt.Errorf("after storing %d of %d keys: %w", len(issued), spec.count, err)
			}
		}
		issued = append(issued, issuedKey{rec: rec, key: key})
	}
	if generateOnly {
		fmt.Fprintf(stderr, "%d key(s) generated, not stored (no database configured): a replica accepts them once they are listed in its keys file (--keys-file)\n", len(issued))
	}
	return writeKeys(stdout, spec.format, issued)
}

// issuedKey is a new key with its plaintext, which exists only until it is
// printed.
type issuedKey struct {
	rec apikey.Record
	key string
}

// keysFileEntry is one entry of a static keys file (see apikey.ParseKeys).
type keysFileEntry struct {
	Key       string             `yaml:"key"`
	Plan      string             `yaml:"plan"`
	Label     string             `yaml:"label,omitempty"`
	Quotas    []keysFileQuota    `yaml:"quotas,omitempty,flow"`
	Candidate *keysFileCandidate `yaml:"candidate,omitempty"`
}

type keysFileCandidate struct {
	Quotas []keysFileQuota `yaml:"quotas,flow"`
}

type keysFileQuota struct {
	Limit  int64  `yaml:"limit"`
	Period string `yaml:"period"`
}

func writeKeys(w io.Writer, format string, keys []issuedKey) error {
	switch format {
	case "csv":
		cw := csv.NewWriter(w)
		cw.Write([]string{"id", "key", "plan", "label"})
		for _, k := range keys {
			cw.Write([]string{k.rec.ID, k.key, k.rec.Plan, k.rec.Label})
		}
		cw.Flush()
		return cw.Error()
	case "yaml":
		var f struct {
			Keys []keysFileEntry `yaml:"keys"`
		}
		for _, k := range keys {
			e := keysFileEntry{Key: k.key, Plan: k.rec.Plan, Label: k.rec.Label, Quotas: keysFileQuotas(k.rec.Overrides)}
			if len(k.rec.Candidate) > 0 {
				e.Candidate = &keysFileCandidate{Quotas: keysFileQuotas(k.rec.Candidate)}
			}
			f.Keys = append(f.Keys, e)
		}
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(f); err != nil {
			return err
		}
		return enc.Close()
	default:
		for i, k := range keys {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "id:    %s\nplan:  %s\nlabel: %s\nkey:   %s\n", k.rec.ID, k.rec.Plan, k.rec.Label, k.key)
		}
		fmt.Fprintln(w, "\nThe key is shown only this once; store it now. Only its SHA-256 is kept.")
		return nil
	}
}

func keysFileQuotas(ws []ratelimit.Window) []keysFileQuota {
	var out []keysFileQuota
	for _, w := range ws {
		out = append(out, keysFileQuota{Limit: w.Limit, Period: ratelimit.FormatPeriod(w.Period)})
	}
	return out
}

const limitsUsage = "show KEY-ID | unban KEY-ID | reset KEY-ID... | reset --plan PLAN | finalize [--wait DURATION] [--optional] | finalize --undo | finalize --status"

func runLimits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: petstore limits %s", limitsUsage)
	}
	sub, args := args[0], args[1:]
	var planName string
	var undo, status, optional bool
	var wait time.Duration
	extra := func(fs *flag.FlagSet) {
		switch sub {
		case "reset":
			fs.StringVar(&planName, "plan", "", "reset every key of this plan (from the keys file and the database configured)")
		case "finalize":
			fs.BoolVar(&undo, "undo", false, "remove the mark, before rolling back to a release older than finalizing")
			fs.BoolVar(&status, "status", false, "print the mark and the replicas live, change nothing")
			fs.DurationVar(&wait, "wait", 0, "while replicas of an older release are live or Redis does not answer, try again, for at most this long (e.g. 5m, after a rollout)")
			fs.BoolVar(&optional, "optional", false, "when it cannot finalize (older replicas live, Redis not answering; after --wait), say why and exit 0: the records stay as they are, which is safe (a fresh install's hook)")
		}
	}
	cfg, _, fs, err := loadConfig("limits "+sub, limitsUsage, args, getenv, stderr, extra)
	if err != nil {
		return err
	}
	switch {
	case sub == "reset" && planName != "" && fs.NArg() != 0:
		return errors.New("limits reset takes key ids or --plan, not both")
	case sub == "reset" && planName == "" && fs.NArg() == 0:
		return fmt.Errorf("usage: petstore limits %s", limitsUsage)
	case sub == "finalize" && (fs.NArg() != 0 || undo && status || wait < 0 || (wait > 0 || optional) && (undo || status)):
		return fmt.Errorf("usage: petstore limits %s", limitsUsage)
	case sub != "reset" && sub != "finalize" && fs.NArg() != 1:
		return fmt.Errorf("usage: petstore limits %s", limitsUsage)
	}
	keyID := fs.Arg(0)
	// A command-line tool should wait for an answer, not fall back: its
	// calls get seconds, not a request's deadline.
	timeout := max(cfg.Redis.Timeout, 2*time.Second)
	cfg.Redis.Timeout = timeout
	rdb, err := cfg.Redis.NewRedisClient()
	if err != nil {
		return err
	}
	if rdb == nil {
		return errors.New("limits are kept in Redis: set --redis-url or PETSTORE_REDIS_URL (or --redis-addrs)")
	}
	defer rdb.Close()
	// (Admin: a command is no replica; 'finalize --wait' may run for
	// minutes, and the replicas size their shares by the census.)
	limiter, err := ratelimit.New(rdb, ratelimit.Options{Timeout: timeout, FailureMode: ratelimit.FailClosed, Admin: true})
	if err != nil {
		return err
	}
	defer limiter.Close()

	switch sub {
	case "finalize":
		err := finalize(ctx, limiter, undo, status, wait, stdout, stderr)
		var nf *notFinalizedError
		if optional && errors.As(err, &nf) {
			fmt.Fprintf(stdout, "%v; the records stay as they are (safe, only dearer): finalize later with 'petstore limits finalize'\n", err)
			return nil
		}
		return err
	case "unban":
		if err := limiter.Unban(ctx, keyID); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ban lifted for %s on every replica\n", keyID)
		return nil
	case "reset":
		ids := fs.Args()
		if planName != "" {
			if ids, err = keysOfPlan(ctx, cfg, planName); err != nil {
				return err
			}
		}
		for i, id := range ids {
			// A key's window records are named by its plan's windows.
			rec, plans, err := findKey(ctx, cfg, id)
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
		if planName != "" {
			fmt.Fprintf(stdout, "counts, strikes and bans cleared for the %d key(s) of plan %s on every replica\n", len(ids), plan.Normalize(planName))
		} else {
			fmt.Fprintf(stdout, "counts, strikes and bans cleared for %s on every replica\n", strings.Join(ids, ", "))
		}
		return nil
	case "show":
		rec, plans, err := findKey(ctx, cfg, keyID)
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
		printUsage(stdout, rec, policy, u)
		return nil
	default:
		return fmt.Errorf("unknown limits command %q; usage: petstore limits %s", sub, limitsUsage)
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
		switch {
		case st.Finalized.IsZero() && st.Blocks.IsZero():
			fmt.Fprintf(stdout, "not finalized; %d replica(s) live, %d of an older release\n", st.Replicas, st.Older)
		case st.Blocks.IsZero():
			fmt.Fprintf(stdout, "records finalized at %s, blocks not yet; %d replica(s) live, %d of an older release\n", st.Finalized.UTC().Format(time.RFC3339Nano), st.Replicas, st.Older)
		default:
			fmt.Fprintf(stdout, "finalized at %s, blocks since %s; %d replica(s) live, %d of an older release\n", st.Finalized.UTC().Format(time.RFC3339Nano), st.Blocks.UTC().Format(time.RFC3339Nano), st.Replicas, st.Older)
		}
		return nil
	case undo:
		if err := limiter.Unfinalize(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "finalize marks removed; within %s every replica refreshes record expiries on every head move, has stopped reserving blocks and every block has ended: wait that long before starting an older release\n", ratelimit.Unfinalizing)
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
			fmt.Fprintf(stdout, "finalized at %s: within a heartbeat replicas set record expiries once per epoch and reserve blocks for slow keys; rolling back to an older release now needs 'petstore limits finalize --undo' first\n", at.UTC().Format(time.RFC3339Nano))
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
func keysOfPlan(ctx context.Context, cfg config.Config, name string) ([]string, error) {
	recs, plans, err := allKeys(ctx, cfg)
	if err != nil {
		return nil, err
	}
	name = plan.Normalize(name)
	if _, ok := plans.Lookup(name); !ok {
		return nil, fmt.Errorf("%w %q (one of %s)", plan.ErrUnknownPlan, name, strings.Join(plans.Names(), ", "))
	}
	if cfg.KeysFile == "" && cfg.DatabaseURL == "" {
		return nil, errors.New("--plan needs the keys: set --keys-file or --database-url (or their PETSTORE_* twins)")
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
		pool, err := openDB(ctx, cfg)
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
