package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/animal-store/petstore/internal/postgres"
)

// openDB opens the database c's settings name; without one, c was run
// without a setting it needs.
func (c *call) openDB(ctx context.Context) (*pgxpool.Pool, error) {
	if c.cfg.DatabaseURL == "" {
		return nil, c.usageErrorf("%s needs PostgreSQL: set --database-url or PETSTORE_DATABASE_URL", c.cmd.name)
	}
	return postgres.Open(ctx, c.cfg.DatabaseURL, int32(c.cfg.DBMaxConns))
}

// noArgs checks that c was given no positional argument.
func (c *call) noArgs() error {
	if len(c.args) != 0 {
		return c.usageErrorf("%s takes no arguments, got %q", c.cmd.name, c.args)
	}
	return nil
}

// oneArg returns c's single positional argument, called what in errors.
func (c *call) oneArg(what string) (string, error) {
	switch len(c.args) {
	case 0:
		return "", c.usageErrorf("%s needs a %s", c.cmd.name, what)
	case 1:
		return c.args[0], nil
	}
	return "", c.usageErrorf("%s takes one %s, got %q", c.cmd.name, what, c.args)
}

// checkFormat checks a --format flag's value against the formats a
// command writes.
func (c *call) checkFormat(format string, formats ...string) error {
	for _, f := range formats {
		if format == f {
			return nil
		}
	}
	list := formats[0]
	if n := len(formats); n > 1 {
		list = fmt.Sprintf("%s or %s", strings.Join(formats[:n-1], ", "), formats[n-1])
	}
	return c.usageErrorf("--format must be %s, got %q", list, format)
}

func setupMigrate(fs *flag.FlagSet) action {
	status := fs.Bool("status", false, "print the applied and pending migrations, apply nothing; exit non-zero when this release cannot serve the schema (some are pending)")
	return func(ctx context.Context, c *call) error {
		if err := c.noArgs(); err != nil {
			return err
		}
		pool, err := c.openDB(ctx)
		if err != nil {
			return err
		}
		defer pool.Close()
		if *status {
			return printSchemaStatus(ctx, pool, c.stdout)
		}
		applied, err := postgres.Migrate(ctx, pool)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintln(c.stdout, "database schema is up to date")
			return nil
		}
		for _, m := range applied {
			fmt.Fprintf(c.stdout, "applied %s\n", m)
		}
		return nil
	}
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
