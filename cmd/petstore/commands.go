package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"slices"

	"github.com/animal-store/petstore/internal/config"
)

// commands returns the command tree: every command of the binary, with its
// flags and settings, in one place.
func commands() *command {
	db := config.DatabaseSettings
	redis := config.RedisSettings
	files := []string{"plans-file", "keys-file"}
	return &command{
		usage: "COMMAND [flags]",
		about: "petstore serves the Animal Store API v1 and manages its database, API keys and\nrate limits.",
		subs: []*command{
			{
				name:    "serve",
				usage:   "[flags]",
				summary: "run the API (public port) and the ops endpoints",
				about: "Runs the API on --addr and /healthz, /readyz and /metrics on --ops-addr. With no\n" +
					"settings at all it keeps pets in memory and prints a development API key.",
				settings: allSettings(),
				setup:    func(*flag.FlagSet) action { return runServe },
			},
			{
				name:     "migrate",
				usage:    "[--status] [flags]",
				summary:  "apply (or list) the PostgreSQL migrations",
				about:    "Applies the migrations this release needs, under the migration lock.",
				settings: db,
				setup:    setupMigrate,
			},
			{
				name:    "keys",
				usage:   "COMMAND [flags]",
				summary: "create, list and revoke API keys",
				about:   "Manages the API keys stored in PostgreSQL. Only a key's SHA-256 is stored.",
				subs: []*command{
					{
						name:    "keys create",
						usage:   "--plan PLAN [flags]",
						summary: "issue keys on a plan, each printed once",
						about: "Issues --count keys on a plan and prints each key once. Without a database,\n" +
							"--format csv or yaml only generates keys, for a static keys file (--keys-file)\n" +
							"or the load-test kit; --format text needs the database.",
						settings: slices.Concat(db, []string{"plans-file"}),
						setup:    setupKeysCreate,
					},
					{
						name:     "keys list",
						usage:    "[flags]",
						summary:  "list the stored keys (ids, never the keys)",
						settings: db,
						setup:    setupKeysList,
					},
					{
						name:     "keys revoke",
						usage:    "KEY-ID [flags]",
						summary:  "revoke a key by id",
						about:    "Revokes a stored key; replicas stop accepting it within the key cache TTL.",
						settings: slices.Concat(db, []string{"key-cache-ttl"}),
						setup:    func(*flag.FlagSet) action { return revokeKey },
					},
				},
			},
			{
				name:    "limits",
				usage:   "COMMAND [flags]",
				summary: "inspect and clear keys' rate limits; finalize after a rollout",
				about:   "Reads and changes the rate limiter's state in Redis.",
				subs: []*command{
					{
						name:    "limits show",
						usage:   "KEY-ID [flags]",
						summary: "a key's usage, strikes and ban",
						about: "Prints a key's windows (used, remaining, reset), strikes and ban, and its\n" +
							"candidate's. The key is looked up in the keys file, then the database.",
						settings: slices.Concat(redis, files, db),
						setup:    setupLimitsShow,
					},
					{
						name:     "limits unban",
						usage:    "KEY-ID [flags]",
						summary:  "lift a key's temporary ban",
						settings: redis,
						setup:    func(*flag.FlagSet) action { return unban },
					},
					{
						name:    "limits reset",
						usage:   "KEY-ID... [flags]\n--plan PLAN [flags]",
						summary: "clear keys' counts, strikes and bans (between load tests)",
						about: "Clears the counts, strikes and bans of the keys named, or of every key of a\n" +
							"plan (from the keys file and the database configured), on every replica.",
						settings: slices.Concat(redis, files, db),
						setup:    setupLimitsReset,
					},
					{
						name:    "limits finalize",
						usage:   "[--wait DURATION] [--optional] [flags]\n--hold | --release | --undo | --status [flags]",
						summary: "finalize the rate limiter's records now, hold finalizing back, or undo it",
						about: "The fleet finalizes by itself once no replica of an older release has been\n" +
							"live for the replicas' finalize period (a minute by default). This command\n" +
							"finalizes at once and lifts a hold; --hold keeps the fleet from finalizing,\n" +
							"to keep a rollback open through a staged upgrade, until --release or a\n" +
							"finalize; --undo holds and removes the mark before a rollback to a release\n" +
							"older than finalizing.",
						settings: redis,
						setup:    setupFinalize,
					},
				},
			},
			{
				name:    "plans",
				usage:   "COMMAND [flags]",
				summary: "check, show and simulate rate-limit plans",
				about:   "Works on plans files alone: needs neither PostgreSQL nor Redis.",
				subs: []*command{
					{
						name:    "plans check",
						usage:   "FILE [--keys FILE] [flags]",
						summary: "validate a plans file (and a keys file) as a reload would",
						about: "Validates the files with the code a replica's reload runs: its errors are the\n" +
							"ones a rejected reload logs, each naming the field and its line.",
						setup: setupPlansCheck,
					},
					{
						name:    "plans show",
						usage:   "[--plans FILE] [flags]",
						summary: "the plans in force: the file merged over the built-in ones",
						setup:   setupPlansShow,
					},
					{
						name:    "plans simulate",
						usage:   "--access-log FILE... [flags]",
						summary: "replay access logs against proposed plans",
						about:   simulateHelp,
						setup:   setupSimulate,
					},
				},
			},
			{
				name:    "version",
				usage:   "",
				summary: "print the version",
				setup:   func(*flag.FlagSet) action { return printVersion },
			},
		},
	}
}

// allSettings names every setting: serve reads them all.
func allSettings() []string {
	cfg := config.Default()
	var names []string
	for _, s := range config.Register(flag.NewFlagSet("", flag.ContinueOnError), &cfg).Settings() {
		names = append(names, s.Flag)
	}
	return names
}

func printVersion(_ context.Context, c *call) error {
	if len(c.args) != 0 {
		return c.noArgs()
	}
	fmt.Fprintf(c.stdout, "petstore %s (%s)\n", version, runtime.Version())
	return nil
}
