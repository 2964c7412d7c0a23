package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/postgres"
	"github.com/animal-store/petstore/ratelimit"
)

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

// maxKeysPerCreate bounds one `keys create --count`: enough for any load
// test, small enough that a typo cannot fill the key table.
const maxKeysPerCreate = 100000

// keySpec is what `keys create` was asked for.
type keySpec struct {
	plan, label, format string
	quotas, candidate   []ratelimit.Window
	count               int
}

func setupKeysCreate(fs *flag.FlagSet) action {
	var spec keySpec
	fs.StringVar(&spec.plan, "plan", "", "plan of the new keys (required)")
	fs.StringVar(&spec.label, "label", "", "who the keys are for, e.g. a customer name")
	fs.Var((*quotaList)(&spec.quotas), "quota", "the key's own quota `LIMIT/PERIOD`, e.g. 5000/1m (repeatable; replaces the plan's window of that period)")
	fs.Var((*quotaList)(&spec.candidate), "candidate-quota", "a candidate quota `LIMIT/PERIOD` for the key, measured and never enforced, e.g. 200/1m (repeatable; replaces the plan's candidate window of that period)")
	fs.IntVar(&spec.count, "count", 1, fmt.Sprintf("how many keys to create, from 1 to %d", maxKeysPerCreate))
	fs.StringVar(&spec.format, "format", "text", "output: text, csv (id,key,plan,label) or yaml (entries of a static keys file); with csv or yaml and no database the keys are only generated")
	return func(ctx context.Context, c *call) error { return createKeys(ctx, c, spec) }
}

// createKeys issues spec.count keys. With a database they are stored
// (only their hashes); without one, csv and yaml output makes it a pure
// generator for a static keys file and the load-test kit.
func createKeys(ctx context.Context, c *call, spec keySpec) error {
	if err := c.noArgs(); err != nil {
		return err
	}
	if spec.count < 1 || spec.count > maxKeysPerCreate {
		return c.usageErrorf("--count must be between 1 and %d, got %d", maxKeysPerCreate, spec.count)
	}
	if err := c.checkFormat(spec.format, "text", "csv", "yaml"); err != nil {
		return err
	}
	plans, err := plan.Load(c.cfg.PlansFile)
	if err != nil {
		return err
	}
	if spec.plan == "" {
		return c.usageErrorf("--plan is required (one of %s)", strings.Join(plans.Names(), ", "))
	}
	name := plan.Normalize(spec.plan)
	if _, ok := plans.Lookup(name); !ok {
		return c.usageErrorf("unknown plan %q (one of %s)", spec.plan, strings.Join(plans.Names(), ", "))
	}
	// The policy check rejects a per-key plan (Enterprise) without quotas
	// and two quotas of one period before anything is stored.
	if _, err := plans.Policy(name, plan.Overrides{Quotas: spec.quotas, Candidate: spec.candidate}); err != nil {
		return c.usage(err)
	}
	generateOnly := c.cfg.DatabaseURL == ""
	if generateOnly && spec.format == "text" {
		return c.usageErrorf("keys create needs PostgreSQL: set --database-url or PETSTORE_DATABASE_URL (or give --format csv|yaml to only generate keys for a static keys file)")
	}

	var store *postgres.Store
	if !generateOnly {
		pool, err := c.openDB(ctx)
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
		fmt.Fprintf(c.stderr, "%d key(s) generated, not stored (no database configured): a replica accepts them once they are listed in its keys file (--keys-file)\n", len(issued))
	}
	return writeKeys(c.stdout, spec.format, issued)
}

func setupKeysList(fs *flag.FlagSet) action {
	format := fs.String("format", "text", "output: text or json")
	return func(ctx context.Context, c *call) error {
		if err := c.noArgs(); err != nil {
			return err
		}
		if err := c.checkFormat(*format, "text", "json"); err != nil {
			return err
		}
		pool, err := c.openDB(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		recs, err := postgres.New(pool).ListKeys(ctx)
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeKeyListJSON(c.stdout, recs)
		}
		return writeKeyList(c.stdout, recs)
	}
}

// writeKeyList writes keys as a table.
func writeKeyList(w io.Writer, recs []apikey.Record) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
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
}

// The JSON of `keys list`: names a later release keeps, and only adds to.
type (
	jsonKeyList struct {
		Keys []jsonKey `json:"keys"`
	}
	jsonKey struct {
		ID    string `json:"id"`
		Plan  string `json:"plan"`
		Label string `json:"label"`
		// Quotas and Candidate are the key's own, empty when it goes
		// by its plan's.
		Quotas    []jsonWindow `json:"quotas"`
		Candidate []jsonWindow `json:"candidate"`
		CreatedAt time.Time    `json:"createdAt"`
		RevokedAt *time.Time   `json:"revokedAt"` // null: in force
	}
	// jsonWindow is a quota as the API's RateLimitWindow names its parts.
	jsonWindow struct {
		Limit  int64  `json:"limit"`
		Period string `json:"period"`
	}
)

func writeKeyListJSON(w io.Writer, recs []apikey.Record) error {
	out := jsonKeyList{Keys: make([]jsonKey, 0, len(recs))}
	for _, r := range recs {
		k := jsonKey{ID: r.ID, Plan: r.Plan, Label: r.Label, Quotas: windowsJSON(r.Overrides), Candidate: windowsJSON(r.Candidate), CreatedAt: r.CreatedAt.UTC()}
		if r.RevokedAt != nil {
			at := r.RevokedAt.UTC()
			k.RevokedAt = &at
		}
		out.Keys = append(out.Keys, k)
	}
	return writeJSON(w, out)
}

func windowsJSON(ws []ratelimit.Window) []jsonWindow {
	out := make([]jsonWindow, 0, len(ws))
	for _, q := range ws {
		out = append(out, jsonWindow{Limit: q.Limit, Period: ratelimit.FormatPeriod(q.Period)})
	}
	return out
}

// writeJSON writes v indented, as every --format json does.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// revokeKey runs `keys revoke KEY-ID`.
func revokeKey(ctx context.Context, c *call) error {
	id, err := c.oneArg("KEY-ID")
	if err != nil {
		return err
	}
	pool, err := c.openDB(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rec, err := postgres.New(pool).RevokeKey(ctx, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "revoked %s (%s); replicas stop accepting it within %s (the key cache TTL)\n", rec.ID, rec.Label, c.cfg.KeyCacheTTL)
	return nil
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
