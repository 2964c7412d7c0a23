// Command petstore serves the Animal Store API v1 and manages its database,
// API keys and rate limits.
//
//	petstore serve              run the API (public port) and the ops endpoints
//	petstore migrate            apply the PostgreSQL migrations
//	petstore keys create|list|revoke
//	petstore limits show|unban|reset KEY-ID, limits finalize
//	petstore plans check|show   validate the plans file, print the plans in force
//	petstore plans simulate     replay access logs against proposed plans
//	petstore version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "petstore: %v\n", err)
		os.Exit(1)
	}
}

const usage = `petstore serves the Animal Store API v1.

Usage:
  petstore serve  [flags]                 run the API and the ops endpoints
  petstore migrate [--status] [flags]     apply (or list) the PostgreSQL migrations
  petstore keys create --plan P [--label L] [--quota N/PERIOD ...]
                       [--count N] [--format text|csv|yaml]
  petstore keys list
  petstore keys revoke KEY-ID
  petstore limits show KEY-ID             usage, strikes and ban state of a key
  petstore limits unban KEY-ID            lift a key's temporary ban
  petstore limits reset KEY-ID... | --plan P
                                          clear counts, strikes and bans (between load tests)
  petstore limits finalize [--wait D] [--optional] | --undo | --status
                                          once a rollout is done: records written as only this release may
  petstore plans check FILE [--keys FILE] validate a plans file (and a keys file) as a reload would
  petstore plans show [--plans FILE] [--format text|yaml|json]
                                          the plans in force: the file merged over the built-in ones
  petstore plans simulate --access-log FILE... [--plans FILE] [--keys FILE] [--top N] [--format text|json]
                                          replay access logs against proposed plans: what they would limit and ban
  petstore version

Every flag has a PETSTORE_* environment variable twin; run
'petstore serve --help' for the list.
`

// run is the whole program; main only adapts it to the process.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest, getenv, stdout, stderr)
	case "migrate":
		return runMigrate(ctx, rest, getenv, stdout, stderr)
	case "keys":
		return runKeys(ctx, rest, getenv, stdout, stderr)
	case "limits":
		return runLimits(ctx, rest, getenv, stdout, stderr)
	case "plans":
		return runPlans(ctx, rest, getenv, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "petstore %s (%s)\n", version, runtime.Version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
}
