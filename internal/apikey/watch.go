package apikey

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/plan"
)

// DefaultReloadInterval is how often a Watcher looks at its files.
const DefaultReloadInterval = 5 * time.Second

// Values of the file label of petstore_config_reloads_total.
const (
	FilePlans = "plans"
	FileKeys  = "keys"
)

// WatcherOptions configure a Watcher.
type WatcherOptions struct {
	// PlansFile and KeysFile are the files to watch; an empty path means
	// no file (built-in plans, no static keys).
	PlansFile string
	KeysFile  string
	// Interval is how often the files are read; zero means
	// DefaultReloadInterval.
	Interval time.Duration
	// Apply receives each new valid configuration, e.g.
	// (*Authenticator).Update. If it fails, the change is rejected.
	Apply func(*plan.Set, *StaticKeys) error
	// Logger receives one line per applied or rejected change; nil
	// discards them.
	Logger *slog.Logger
	// Registerer, if set, gets petstore_config_reloads_total{file,result}.
	Registerer prometheus.Registerer
}

// Watcher reloads the plans and keys files when their content changes.
//
// It reads both files every interval and compares their SHA-256 with what
// it last saw, so it notices a file edited in place as well as a
// Kubernetes ConfigMap update, which swaps a symlink (..data) under the
// mounted names. A change is parsed and validated as a whole — the keys
// against the new plans — and applied at once; an invalid change is logged
// once, counted, and ignored, and the configuration in force stays until a
// valid one replaces it.
type Watcher struct {
	opts    WatcherOptions
	log     *slog.Logger
	reloads *prometheus.CounterVec

	// seen is the content (or read error) last looked at, per file.
	seen map[string][sha256.Size]byte
}

// NewWatcher returns a watcher; Load or Run starts it.
func NewWatcher(opts WatcherOptions) (*Watcher, error) {
	if opts.Apply == nil {
		return nil, errors.New("apikey: watcher needs an Apply function")
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultReloadInterval
	}
	w := &Watcher{
		opts: opts,
		log:  opts.Logger,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "petstore",
			Name:      "config_reloads_total",
			Help:      "Changes of the plans and keys files seen, by file and result (success: applied; error: rejected, the previous configuration stays).",
		}, []string{"file", "result"}),
		seen: make(map[string][sha256.Size]byte),
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	for _, f := range []string{FilePlans, FileKeys} {
		for _, r := range []string{"success", "error"} {
			w.reloads.WithLabelValues(f, r)
		}
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(w.reloads); err != nil {
			return nil, fmt.Errorf("apikey: register reload metrics: %w", err)
		}
	}
	return w, nil
}

// snapshot is both files as read at one moment.
type snapshot struct {
	plans, keys fileRead
}

type fileRead struct {
	data []byte
	err  error
	sum  [sha256.Size]byte
}

func read(path string) fileRead {
	if path == "" {
		return fileRead{}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fileRead{err: err, sum: sha256.Sum256([]byte("error: " + err.Error()))}
	}
	return fileRead{data: data, sum: sha256.Sum256(data)}
}

// readBoth reads both files so that a ConfigMap update, which swaps both at
// once, is never seen half done: if the plans file changed while the keys
// file was read, it reads again.
func (w *Watcher) readBoth() snapshot {
	var s snapshot
	for range 3 {
		s = snapshot{plans: read(w.opts.PlansFile), keys: read(w.opts.KeysFile)}
		if read(w.opts.PlansFile).sum == s.plans.sum {
			break
		}
	}
	return s
}

// LoadFiles reads the plans file and the keys file and validates them as
// a whole, the keys against those plans, as a Watcher does on start-up and
// on every change: its error is the one a reload would log. An empty path
// means no file (built-in plans, no static keys).
func LoadFiles(plansFile, keysFile string) (*plan.Set, *StaticKeys, error) {
	return parse(plansFile, keysFile, snapshot{plans: read(plansFile), keys: read(keysFile)})
}

// parse validates a snapshot of the files at plansFile and keysFile as a
// whole.
func parse(plansFile, keysFile string, s snapshot) (*plan.Set, *StaticKeys, error) {
	plans := plan.Defaults()
	if plansFile != "" {
		if s.plans.err != nil {
			return nil, nil, fmt.Errorf("plans file: %w", s.plans.err)
		}
		var err error
		if plans, err = plan.Parse(s.plans.data); err != nil {
			return nil, nil, fmt.Errorf("plans file %s: %w", plansFile, err)
		}
	}
	keys := &StaticKeys{}
	if keysFile != "" {
		if s.keys.err != nil {
			return nil, nil, fmt.Errorf("keys file: %w", s.keys.err)
		}
		var err error
		if keys, err = ParseKeys(s.keys.data, plans); err != nil {
			return nil, nil, fmt.Errorf("keys file %s: %w", keysFile, err)
		}
	}
	return plans, keys, nil
}

// Load reads, validates and applies both files, whatever was seen before.
// Call it at start-up: its error means the service cannot start with the
// files as they are.
func (w *Watcher) Load() error {
	s := w.readBoth()
	w.seen[FilePlans], w.seen[FileKeys] = s.plans.sum, s.keys.sum
	plans, keys, err := parse(w.opts.PlansFile, w.opts.KeysFile, s)
	if err != nil {
		return err
	}
	if err := w.opts.Apply(plans, keys); err != nil {
		return fmt.Errorf("apply configuration: %w", err)
	}
	w.log.Info("configuration loaded", "plans_file", w.opts.PlansFile, "keys_file", w.opts.KeysFile,
		"plans", len(plans.Names()), "static_keys", keys.Len())
	return nil
}

// Check reads both files once and, if either changed since last seen,
// applies the new configuration or rejects it. It reports whether anything
// changed and, if the change was rejected, why. It is not safe to call
// concurrently with itself, Load or Run.
func (w *Watcher) Check() (changed bool, err error) {
	s := w.readBoth()
	var files []string
	if s.plans.sum != w.seen[FilePlans] {
		files = append(files, FilePlans)
	}
	if s.keys.sum != w.seen[FileKeys] {
		files = append(files, FileKeys)
	}
	if len(files) == 0 {
		return false, nil
	}
	w.seen[FilePlans], w.seen[FileKeys] = s.plans.sum, s.keys.sum

	plans, keys, err := parse(w.opts.PlansFile, w.opts.KeysFile, s)
	if err == nil {
		if aerr := w.opts.Apply(plans, keys); aerr != nil {
			err = fmt.Errorf("apply configuration: %w", aerr)
		}
	}
	result := "success"
	if err != nil {
		result = "error"
	}
	for _, f := range files {
		w.reloads.WithLabelValues(f, result).Inc()
	}
	if err != nil {
		w.log.Error("configuration change rejected; the previous configuration stays in force", "changed", files, "error", err)
		return true, err
	}
	w.log.Info("configuration reloaded", "changed", files, "plans", len(plans.Names()), "static_keys", keys.Len())
	return true, nil
}

// Run checks the files every interval until ctx is done, then returns nil.
// Without a prior Load, the first check applies the files as found.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_, _ = w.Check() // logged and counted by Check
		}
	}
}
