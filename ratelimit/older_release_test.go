package ratelimit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// olderScript is the decision script of the release before records could
// be finalized, built from git as that release committed it: the parent
// of the commit that added ratelimit/finalize.go. A small test written
// into a copy of that tree writes its decideLua to a file, kept under the
// temporary directory by revision, so the build runs once per machine.
// (A hand-kept copy of the script would be a second copy of its rules.)
var olderScript = sync.OnceValues(func() (*redis.Script, error) {
	src, err := olderDecideLua()
	if err != nil {
		return nil, fmt.Errorf("the release before finalizing, from git: %w", err)
	}
	return redis.NewScript(src), nil
})

func olderDecideLua() (string, error) {
	added, err := gitOutput("log", "--diff-filter=A", "--format=%H", "--", "ratelimit/finalize.go")
	if err != nil || added == "" {
		return "", fmt.Errorf("no commit adds ratelimit/finalize.go (a full git checkout is needed): %v", err)
	}
	fields := strings.Fields(added)
	rev, err := gitOutput("rev-parse", fields[len(fields)-1]+"^")
	if err != nil {
		return "", err
	}
	out := filepath.Join(os.TempDir(), "petstore-decide-"+rev+".lua")
	if b, err := os.ReadFile(out); err == nil && len(b) > 0 {
		return string(b), nil
	}
	dir, err := os.MkdirTemp("", "petstore-older-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	archive := exec.Command("sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", rev, dir)
	archive.Dir = ".."
	if b, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %v: %s", rev, err, b)
	}
	const writer = `package ratelimit

import (
	"os"
	"testing"
)

func TestWriteDecideLua(t *testing.T) {
	if err := os.WriteFile(os.Getenv("DECIDE_LUA_OUT"), []byte(decideLua), 0o644); err != nil {
		t.Fatal(err)
	}
}
`
	if err := os.WriteFile(filepath.Join(dir, "ratelimit", "zz_write_decide_test.go"), []byte(writer), 0o644); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	build := exec.Command("go", "test", "-count=1", "-run", "^TestWriteDecideLua$", "./ratelimit/")
	build.Dir = dir
	build.Env = append(os.Environ(), "DECIDE_LUA_OUT="+tmp, "GOFLAGS=-mod=mod")
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("writing %s's decision script: %v: %s", rev[:12], err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	b, err := os.ReadFile(out)
	return string(b), err
}

// gitOutput runs git in the repository and returns its trimmed output.
func gitOutput(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = ".."
	b, err := cmd.Output()
	return strings.TrimSpace(string(b)), err
}
