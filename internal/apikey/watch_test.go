package apikey_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/animal-store/petstore/internal/apikey"
	"github.com/animal-store/petstore/internal/plan"
)

const (
	plansV1 = "plans: {free: {quotas: [{limit: 60, period: 1m}]}}\n"
	plansV2 = "plans: {free: {quotas: [{limit: 7, period: 1m}]}}\n"
	keysV1  = "keys: [{key: " + devKey + ", plan: free}]\n"
	keysV2  = "keys: [{key: " + devKey + ", plan: free}, {key: " + otherKey + ", plan: pro}]\n"
)

// syncBuffer is a log sink safe for a watcher running in another goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

type watched struct {
	auth    *apikey.Authenticator
	watcher *apikey.Watcher
	reg     *prometheus.Registry
	log     *syncBuffer
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newWatched(t *testing.T, plansFile, keysFile string, interval time.Duration) *watched {
	t.Helper()
	w := &watched{auth: newAuth(t, apikey.Options{}), reg: prometheus.NewRegistry(), log: &syncBuffer{}}
	var err error
	w.watcher, err = apikey.NewWatcher(apikey.WatcherOptions{
		PlansFile:  plansFile,
		KeysFile:   keysFile,
		Interval:   interval,
		Apply:      w.auth.Update,
		Logger:     slog.New(slog.NewTextHandler(w.log, nil)),
		Registerer: w.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// limit returns the first quota of key's policy, or -1 if it does not
// authenticate.
func (w *watched) limit(key string) int64 {
	p, err := w.auth.Authenticate(context.Background(), key, nil)
	if err != nil {
		return -1
	}
	return p.Policy.Windows[0].Limit
}

func (w *watched) reloads(t *testing.T, file, result string) float64 {
	t.Helper()
	families, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "petstore_config_reloads_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["file"] == file && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no petstore_config_reloads_total{file=%q,result=%q}", file, result)
	return 0
}

func (w *watched) check(t *testing.T, wantChanged, wantErr bool) {
	t.Helper()
	changed, err := w.watcher.Check()
	if changed != wantChanged || (err != nil) != wantErr {
		t.Fatalf("Check() = %v, %v; want changed %v, error %v", changed, err, wantChanged, wantErr)
	}
}

func TestWatcher(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plansFile, keysFile := filepath.Join(dir, "plans.yaml"), filepath.Join(dir, "keys.yaml")
	write(t, plansFile, plansV1)
	write(t, keysFile, keysV1)
	w := newWatched(t, plansFile, keysFile, time.Hour)
	if err := w.watcher.Load(); err != nil {
		t.Fatal(err)
	}
	if got := w.limit(devKey); got != 60 {
		t.Fatalf("after Load: limit %d, want 60", got)
	}
	w.check(t, false, false)

	// A valid change of the plans is applied and reflected in the next
	// principal.
	write(t, plansFile, plansV2)
	w.check(t, true, false)
	if got := w.limit(devKey); got != 7 {
		t.Fatalf("after a plans change: limit %d, want 7", got)
	}
	if got := w.reloads(t, "plans", "success"); got != 1 {
		t.Fatalf("plans successes = %v, want 1", got)
	}

	// A new key in the keys file.
	write(t, keysFile, keysV2)
	w.check(t, true, false)
	if got := w.limit(otherKey); got != 300 {
		t.Fatalf("new key: limit %d, want pro's 300", got)
	}

	// An invalid change is rejected, logged once and counted; the previous
	// configuration stays.
	logged := len(w.log.lines())
	write(t, plansFile, "plans: {free: {quotas: [{limit: 0, period: 1m}]}}\n")
	w.check(t, true, true)
	w.check(t, false, false) // the same bad content is not reported again
	if got := w.limit(devKey); got != 7 {
		t.Fatalf("after an invalid change: limit %d, want 7 still", got)
	}
	if got := w.reloads(t, "plans", "error"); got != 1 {
		t.Fatalf("plans errors = %v, want 1", got)
	}
	lines := w.log.lines()[logged:]
	if len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], "plans.free.quotas[0].limit") {
		t.Fatalf("log after an invalid change = %q, want one error line naming the field", lines)
	}

	// Plans that the keys no longer fit are rejected too: pro disappears
	// while a key is on it.
	write(t, plansFile, "plans: {pro: {remove: true}}\n")
	w.check(t, true, true)
	if got := w.limit(otherKey); got != 300 {
		t.Fatalf("after a change the keys do not fit: limit %d, want 300 still", got)
	}
	if got := w.reloads(t, "plans", "error"); got != 2 {
		t.Fatalf("plans errors = %v, want 2", got)
	}

	// Fixing both files at once applies them together.
	write(t, plansFile, "plans: {pro: {remove: true}, free: {quotas: [{limit: 9, period: 1m}]}}\n")
	write(t, keysFile, keysV1)
	w.check(t, true, false)
	if a, b := w.limit(devKey), w.limit(otherKey); a != 9 || b != -1 {
		t.Fatalf("after fixing both: limits %d and %d, want 9 and none", a, b)
	}
	if p, k := w.reloads(t, "plans", "success"), w.reloads(t, "keys", "success"); p != 2 || k != 2 {
		t.Fatalf("successes: plans %v keys %v, want 2 and 2", p, k)
	}

	// A file that cannot be read is an invalid change.
	if err := os.Remove(keysFile); err != nil {
		t.Fatal(err)
	}
	w.check(t, true, true)
	if got := w.limit(devKey); got != 9 {
		t.Fatalf("after the keys file vanished: limit %d, want 9 still", got)
	}
	if got := w.reloads(t, "keys", "error"); got != 1 {
		t.Fatalf("keys errors = %v, want 1", got)
	}
	for _, line := range w.log.lines() {
		if strings.Contains(line, devKey) || strings.Contains(line, otherKey) {
			t.Fatalf("a key was logged: %s", line)
		}
	}
}

// A Kubernetes ConfigMap volume holds the files in a timestamped directory
// reached through the ..data symlink, and updates them by pointing ..data
// at a new directory.
func TestWatcherFollowsConfigMapSwap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	version := func(name, plans, keys string) {
		t.Helper()
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(d, "plans.yaml"), plans)
		write(t, filepath.Join(d, "keys.yaml"), keys)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2030_01_01_00_00_00.1", plansV1, keysV1)
	for _, f := range []string{"plans.yaml", "keys.yaml"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	w := newWatched(t, filepath.Join(dir, "plans.yaml"), filepath.Join(dir, "keys.yaml"), time.Hour)
	if err := w.watcher.Load(); err != nil {
		t.Fatal(err)
	}
	version("..2030_01_01_00_05_00.2", plansV2, keysV2)
	w.check(t, true, false)
	if a, b := w.limit(devKey), w.limit(otherKey); a != 7 || b != 300 {
		t.Fatalf("after the swap: limits %d and %d, want 7 and 300", a, b)
	}
	if p, k := w.reloads(t, "plans", "success"), w.reloads(t, "keys", "success"); p != 1 || k != 1 {
		t.Fatalf("successes: plans %v keys %v, want 1 each", p, k)
	}
}

func TestWatcherRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plansFile := filepath.Join(dir, "plans.yaml")
	keysFile := filepath.Join(dir, "keys.yaml")
	write(t, plansFile, plansV1)
	write(t, keysFile, keysV1)
	w := newWatched(t, plansFile, keysFile, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.watcher.Run(ctx) }()

	// Without Load, the first check applies the files as found.
	waitFor(t, func() bool { return w.limit(devKey) == 60 })
	write(t, plansFile, plansV2)
	waitFor(t, func() bool { return w.limit(devKey) == 7 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run() = %v, want nil once cancelled", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWatcherLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plansFile, keysFile := filepath.Join(dir, "plans.yaml"), filepath.Join(dir, "keys.yaml")
	write(t, plansFile, "plans: {free: {remove: true}}\n")
	write(t, keysFile, keysV1)
	w := newWatched(t, plansFile, keysFile, time.Hour)
	if err := w.watcher.Load(); err == nil || !strings.Contains(err.Error(), "keys[0]") {
		t.Fatalf("Load() = %v, want the keys file rejected for its plan", err)
	}

	// No files: built-in plans, no static keys.
	none := newWatched(t, "", "", time.Hour)
	if err := none.watcher.Load(); err != nil {
		t.Fatal(err)
	}
	if !equalNames(none.auth.Plans(), plan.Defaults()) || none.auth.Keys().Len() != 0 {
		t.Fatal("without files the configuration is not the built-in one")
	}
	none.check(t, false, false)
}

func equalNames(a, b *plan.Set) bool {
	return strings.Join(a.Names(), ",") == strings.Join(b.Names(), ",")
}

func TestNewWatcher(t *testing.T) {
	t.Parallel()
	if _, err := apikey.NewWatcher(apikey.WatcherOptions{}); err == nil {
		t.Fatal("NewWatcher without Apply succeeded")
	}
	reg := prometheus.NewRegistry()
	apply := func(*plan.Set, *apikey.StaticKeys) error { return nil }
	if _, err := apikey.NewWatcher(apikey.WatcherOptions{Apply: apply, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := apikey.NewWatcher(apikey.WatcherOptions{Apply: apply, Registerer: reg}); !errors.As(err, &are) {
		t.Fatalf("second registration: %v, want AlreadyRegisteredError", err)
	}
}

// TestLoadFilesIsTheReload checks that LoadFiles, which validates files
// offline, reports exactly what a replica's reload logs for them.
func TestLoadFilesIsTheReload(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, plans, keys string
	}{
		{"bad plans file", "plans:\n  free:\n    quotas: [{limit: 0, period: 1m}]\n", keysV1},
		{"key on an unknown plan", plansV1, "keys:\n  - {key: " + devKey + ", plan: gold}\n"},
		{"empty plans file", "", keysV1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			plansFile, keysFile := filepath.Join(dir, "plans.yaml"), filepath.Join(dir, "keys.yaml")
			write(t, plansFile, plansV1)
			write(t, keysFile, keysV1)
			w := newWatched(t, plansFile, keysFile, time.Hour)
			if err := w.watcher.Load(); err != nil {
				t.Fatal(err)
			}
			write(t, plansFile, tt.plans)
			write(t, keysFile, tt.keys)
			_, reloadErr := w.watcher.Check()
			_, _, err := apikey.LoadFiles(plansFile, keysFile)
			if err == nil || reloadErr == nil || err.Error() != reloadErr.Error() {
				t.Fatalf("LoadFiles() = %v\nreload      = %v\nwant the same error", err, reloadErr)
			}
			if log := strings.Join(w.log.lines(), "\n"); !strings.Contains(log, "configuration change rejected") {
				t.Fatalf("the reload logged no rejection:\n%s", log)
			}
		})
	}
	plans, keys, err := apikey.LoadFiles("", "")
	if err != nil || len(plans.Names()) != len(plan.Defaults().Names()) || keys.Len() != 0 {
		t.Fatalf("LoadFiles(\"\", \"\") = %v, %v, %v; want the built-in plans and no keys", plans, keys, err)
	}
}
