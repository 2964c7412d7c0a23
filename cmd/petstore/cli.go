package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/animal-store/petstore/internal/config"
)

// command is one command of the petstore binary. The tree of commands
// (commands.go) is the one description of the command line: dispatch, help
// and usage errors all read it, so a command's help lists exactly the flags
// it parses.
type command struct {
	// name is the command's path below petstore ("keys create"); empty
	// for petstore itself.
	name string
	// usage is what follows "petstore NAME" on the usage line ("--plan PLAN
	// [flags]"); one line per form of the command.
	usage string
	// summary is the command's one line in its parent's help.
	summary string
	// about is the help's text after the usage line; may be empty.
	about string
	// settings names the configuration settings the command reads
	// (config.Setting.Flag): each a flag with its environment variable.
	settings []string
	// setup defines the command's own flags on fs and returns what runs
	// the command once they are parsed. Nil for a command with
	// subcommands.
	setup func(fs *flag.FlagSet) action
	subs  []*command
}

// action runs a command once its flags are parsed.
type action func(ctx context.Context, c *call) error

// call is one run of a command: its configuration, arguments and outputs.
type call struct {
	cmd      *command
	cfg      config.Config
	settings *config.Set
	// args are the positional arguments, the flags taken out.
	args           []string
	getenv         func(string) string
	stdout, stderr io.Writer
}

// usageError is an invocation that cannot run as given: an unknown command
// or flag, a bad flag value, a missing or extra argument, a setting a
// command needs left out. main prints it with a pointer to the command's
// help and exits 2; every other error exits 1.
type usageError struct {
	// cmd is the command's path below petstore.
	cmd string
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usageErrorf is a usage error of c's command.
func (c *call) usageErrorf(format string, a ...any) error {
	return &usageError{cmd: c.cmd.name, err: fmt.Errorf(format, a...)}
}

// usage makes err, found while checking what c was given, a usage error of
// c's command.
func (c *call) usage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{cmd: c.cmd.name, err: err}
}

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// report writes err as main prints it and returns the exit status it
// means: a usage error is followed by one line naming the command's help.
func report(w io.Writer, err error) int {
	fmt.Fprintf(w, "petstore: %v\n", err)
	if ue, ok := errors.AsType[*usageError](err); ok {
		fmt.Fprintf(w, "Run '%s --help' for usage.\n", ue.path())
		return exitUsage
	}
	return exitError
}

func (e *usageError) path() string { return strings.TrimSpace("petstore " + e.cmd) }

// path is the command as typed: "petstore keys create".
func (cmd *command) path() string { return strings.TrimSpace("petstore " + cmd.name) }

// sub returns the subcommand called name.
func (cmd *command) sub(name string) *command {
	for _, s := range cmd.subs {
		if s.name == strings.TrimSpace(cmd.name+" "+name) {
			return s
		}
	}
	return nil
}

// subNames lists the subcommands' last words: "create, list or revoke".
func (cmd *command) subNames() string {
	names := make([]string, len(cmd.subs))
	for i, s := range cmd.subs {
		names[i] = s.word()
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// word is the command's last word: "create".
func (cmd *command) word() string { return cmd.name[strings.LastIndexByte(cmd.name, ' ')+1:] }

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// execute runs cmd with args: a subcommand's, or cmd's own action once its
// flags and settings are parsed.
func (cmd *command) execute(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if cmd.setup == nil {
		switch {
		case len(args) == 0 && cmd.name == "":
			return &usageError{err: fmt.Errorf("no command given (one of %s)", cmd.subNames())}
		case len(args) == 0:
			return &usageError{cmd: cmd.name, err: fmt.Errorf("%s needs a command: %s", cmd.name, cmd.subNames())}
		case isHelp(args[0]):
			return cmd.help(stdout)
		case strings.HasPrefix(args[0], "-"):
			return &usageError{cmd: cmd.name, err: fmt.Errorf("unknown flag %s (a command comes first: %s)", args[0], cmd.subNames())}
		}
		sub := cmd.sub(args[0])
		if sub == nil {
			return &usageError{cmd: cmd.name, err: fmt.Errorf("unknown %s %q (one of %s)", strings.TrimSpace(cmd.name+" command"), args[0], cmd.subNames())}
		}
		return sub.execute(ctx, args[1:], getenv, stdout, stderr)
	}
	fs, run, set, cfg := cmd.flags()
	rest, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return cmd.help(stdout)
	}
	if err == nil {
		err = set.ApplyEnv(getenv)
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return &usageError{cmd: cmd.name, err: flagError(fs, err)}
	}
	return run(ctx, &call{cmd: cmd, cfg: *cfg, settings: set, args: rest, getenv: getenv, stdout: stdout, stderr: stderr})
}

// flags returns a flag set holding cmd's own flags and its settings, which
// the flag set's parsing fills in cfg; it prints nothing.
func (cmd *command) flags() (*flag.FlagSet, action, *config.Set, *config.Config) {
	fs := flag.NewFlagSet(cmd.path(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	run := cmd.setup(fs)
	cfg := config.Default()
	set := config.RegisterOnly(fs, &cfg, cmd.settings...)
	return fs, run, set, &cfg
}

// parseInterspersed parses flags given before, between or after the
// arguments, and returns the arguments; every argument after "--" is one.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		if len(left) == 0 {
			return rest, nil
		}
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), nil
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// The flag package's messages, reworded with the two dashes help shows.
var (
	undefinedRE = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	invalidRE   = regexp.MustCompile(`^invalid (?:boolean )?value (".*") for (?:flag )?-+([^:]+): (.*)$`)
	noValueRE   = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// flagError words an error of the flag package, parsing fs, as help names
// flags.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if m := undefinedRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("unknown flag --%s", m[1])
	}
	if m := invalidRE.FindStringSubmatch(msg); m != nil {
		why := strings.TrimPrefix(m[3], m[1]+": ")
		if f := fs.Lookup(m[2]); f != nil && (why == "parse error" || why == "value out of range") {
			// The flag package's own numbers and durations.
			switch arg, _ := flagArg(f); arg {
			case "N":
				why = "want a whole number"
			case "DURATION":
				why = "want a duration (e.g. 500ms, 5s, 1m)"
			}
		}
		return fmt.Errorf("invalid value %s for --%s: %s", m[1], m[2], why)
	}
	if m := noValueRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("flag --%s needs a value", m[1])
	}
	return err
}

// help writes cmd's help: its usage, what it does, its subcommands or its
// flags, each flag with its environment variable if it has one.
func (cmd *command) help(w io.Writer) error {
	forms := strings.Split(cmd.usage, "\n")
	for i, f := range forms {
		lead := "Usage: "
		if i > 0 {
			lead = "       "
		}
		fmt.Fprintln(w, strings.TrimRight(lead+cmd.path()+" "+f, " "))
	}
	if cmd.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.about))
	}
	if cmd.setup == nil {
		fmt.Fprintln(w, "\nCommands:")
		width := 0
		for _, s := range cmd.subs {
			width = max(width, len(s.word()))
		}
		for _, s := range cmd.subs {
			fmt.Fprintf(w, "  %-*s  %s\n", width, s.word(), s.summary)
		}
		fmt.Fprintf(w, "\nRun '%s COMMAND --help' for a command's flags.\n", cmd.path())
		return nil
	}
	fs, _, set, _ := cmd.flags()
	settings := set.Settings()
	isSetting := func(name string) bool {
		return slices.ContainsFunc(settings, func(s config.Setting) bool { return s.Flag == name })
	}
	var own []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !isSetting(f.Name) {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprintln(w, "\nFlags:")
		for _, f := range own {
			arg, text := flagArg(f)
			def := f.DefValue
			if arg == "" || def == "0" || def == "0s" {
				def = "" // a boolean's false, a number's or a duration's none
			}
			writeFlag(w, f.Name, arg, "", text, def)
		}
	}
	if len(settings) > 0 {
		fmt.Fprintln(w, "\nSettings (each a flag or its environment variable; the flag wins):")
		for _, s := range settings {
			writeFlag(w, s.Flag, s.Arg, s.Env, s.Usage, s.Default)
		}
	}
	return nil
}

// flagArg returns what a command's own flag takes, for help, and its text:
// the word its usage quotes in back quotes, else one its type implies.
func flagArg(f *flag.Flag) (arg, text string) {
	arg, text = flag.UnquoteUsage(f)
	if strings.Contains(f.Usage, "`") {
		return arg, text
	}
	switch arg {
	case "":
		return "", text // a boolean
	case "int":
		return "N", text
	case "duration":
		return "DURATION", text
	}
	return strings.ToUpper(f.Name), text
}

// helpWidth is where help's text wraps.
const helpWidth = 80

// writeFlag writes one flag of a help: its name and argument (and
// environment variable) on a line, its text wrapped below it.
func writeFlag(w io.Writer, name, arg, env, text, def string) {
	line := "  --" + name
	if arg != "" {
		line += " " + arg
	}
	if env != "" {
		line += "  (env " + env + ")"
	}
	if def != "" {
		text += " (default " + def + ")"
	}
	fmt.Fprintln(w, line)
	const indent = "        "
	cur := indent
	for _, word := range strings.Fields(text) {
		if len(cur) > len(indent) && len(cur)+1+len(word) > helpWidth {
			fmt.Fprintln(w, cur)
			cur = indent
		}
		if len(cur) > len(indent) {
			cur += " "
		}
		cur += word
	}
	fmt.Fprintln(w, cur)
}
