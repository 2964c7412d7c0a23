// Command petstore serves the Animal Store API v1 and manages its database,
// API keys and rate limits.
//
//	petstore serve              run the API (public port) and the ops endpoints
//	petstore migrate            apply the PostgreSQL migrations
//	petstore keys create|list|revoke
//	petstore limits show|unban|reset|finalize
//	petstore plans check|show|simulate
//	petstore version
//
// Every command answers --help (or -h) on stdout. The exit status is 0 on
// success and for help, 2 for a usage error (unknown command or flag, bad
// flag value, missing argument or setting: the error and one line naming
// the command's help on stderr), 1 for any other error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		os.Exit(report(os.Stderr, err))
	}
}

// run is the whole program; main only adapts it to the process.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	root := commands()
	if len(args) > 0 {
		switch args[0] {
		case "--version":
			args = append([]string{"version"}, args[1:]...)
		case "help":
			// petstore help [COMMAND...]: that command's help.
			cmd := root
			for _, name := range args[1:] {
				sub := cmd.sub(name)
				if sub == nil || cmd.setup != nil {
					return &usageError{err: fmt.Errorf("no help for %q: not a command of %s", name, cmd.path())}
				}
				cmd = sub
			}
			return cmd.help(stdout)
		}
	}
	return root.execute(ctx, args, getenv, stdout, stderr)
}
