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

	"github.com/jackc/pgx/v5/pgxpool"

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
	cfg, _, _, err := loadConfig("migrate", "[flags]", args, getenv, stderr, nil)
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
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

const keysUsage = "create --plan PLAN [--label LABEL] [--quota LIMIT/PERIOD ...] | list | revoke KEY-ID"

func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: petstore keys %s", keysUsage)
	}
	sub, args := args[0], args[1:]
	var (
		planName, label string
		quotas          quotaList
	)
	extra := func(fs *flag.FlagSet) {
		if sub == "create" {
			fs.StringVar(&planName, "plan", "", "plan of the new key (required)")
			fs.StringVar(&label, "label", "", "who the key is for, e.g. a customer name")
			fs.Var(&quotas, "quota", "the key's own quota LIMIT/PERIOD, e.g. 5000/1m (repeatable; replaces the plan's window of that period)")
		}
	}
	cfg, _, fs, err := loadConfig("keys "+sub, keysUsage, args, getenv, stderr, extra)
	if err != nil {
		return err
	}
	pool, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := postgres.New(pool)

	switch sub {
	case "create":
		if fs.NArg() != 0 {
			return fmt.Errorf("keys create takes no arguments, got %q", fs.Args())
		}
		plans, err := plan.Load(cfg.PlansFile)
		if err != nil {
			return err
		}
		if planName == "" {
			return fmt.Errorf("--plan is required (one of %s)", strings.Join(plans.Names(), ", "))
		}
		name := plan.Normalize(planName)
		// The policy check rejects an unknown plan and a per-key plan
		// (Enterprise) without quotas before anything is stored.
		if _, err := plans.Policy(name, quotas); err != nil {
			return err
		}
		key, err := apikey.Generate()
		if err != nil {
			return err
		}
		h := apikey.Hash(key)
		rec := apikey.Record{
			ID:        apikey.IDFromHash(h),
			Hash:      h,
			Label:     label,
			Plan:      name,
			Overrides: quotas,
			CreatedAt: time.Now().UTC(),
		}
		if err := store.CreateKey(ctx, rec); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "id:    %s\nplan:  %s\nlabel: %s\nkey:   %s\n\nThe key is shown only this once; store it now. Only its SHA-256 is kept.\n", rec.ID, rec.Plan, rec.Label, key)
		return nil
	case "list":
		recs, err := store.ListKeys(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPLAN\tQUOTAS\tLABEL\tCREATED\tREVOKED")
		for _, r := range recs {
			revoked := "-"
			if r.RevokedAt != nil {
				revoked = r.RevokedAt.UTC().Format(time.RFC3339)
			}
			q := "plan"
			if len(r.Overrides) > 0 {
				q = plan.FormatQuotas(r.Overrides)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Plan, q, r.Label, r.CreatedAt.UTC().Format(time.RFC3339), revoked)
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

const limitsUsage = "show KEY-ID | unban KEY-ID"

func runLimits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: petstore limits %s", limitsUsage)
	}
	sub, args := args[0], args[1:]
	cfg, _, fs, err := loadConfig("limits "+sub, limitsUsage, args, getenv, stderr, nil)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: petstore limits %s", limitsUsage)
	}
	keyID := fs.Arg(0)
	rdb, err := cfg.Redis.NewRedisClient()
	if err != nil {
		return err
	}
	if rdb == nil {
		return errors.New("limits are kept in Redis: set --redis-url or PETSTORE_REDIS_URL (or --redis-addrs)")
	}
	defer rdb.Close()
	// A command-line tool should wait for an answer, not fall back.
	timeout := max(cfg.Redis.Timeout, 2*time.Second)
	limiter, err := ratelimit.New(rdb, ratelimit.Options{Timeout: timeout, FailureMode: ratelimit.FailClosed})
	if err != nil {
		return err
	}
	defer limiter.Close()

	switch sub {
	case "unban":
		if err := limiter.Unban(ctx, keyID); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ban lifted for %s on every replica\n", keyID)
		return nil
	case "show":
		rec, plans, err := findKey(ctx, cfg, keyID)
		if err != nil {
			return err
		}
		policy, err := plans.Policy(rec.Plan, rec.Overrides)
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

// findKey looks a key up by id in the static keys file, then the database.
func findKey(ctx context.Context, cfg config.Config, id string) (apikey.Record, *plan.Set, error) {
	plans, err := plan.Load(cfg.PlansFile)
	if err != nil {
		return apikey.Record{}, nil, err
	}
	if cfg.KeysFile != "" {
		keys, err := apikey.LoadKeys(cfg.KeysFile, plans)
		if err != nil {
			return apikey.Record{}, nil, err
		}
		for _, r := range keys.Records() {
			if r.ID == id {
				return r, plans, nil
			}
		}
	}
	if cfg.DatabaseURL != "" {
		pool, err := openDB(ctx, cfg)
		if err != nil {
			return apikey.Record{}, nil, err
		}
		defer pool.Close()
		recs, err := postgres.New(pool).ListKeys(ctx)
		if err != nil {
			return apikey.Record{}, nil, err
		}
		for _, r := range recs {
			if r.ID == id {
				return r, plans, nil
			}
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
}
