package ratelimit

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestMain runs the package's tests, on the decision code in the
// directory PETSTORE_MUTANT_LUA names when it is set: the mutation check
// (.ci/mutants) builds the tests once and runs them on each mutant of
// those files.
func TestMain(m *testing.M) {
	if dir := os.Getenv("PETSTORE_MUTANT_LUA"); dir != "" {
		for name, v := range map[string]*string{"ring": &ringLua, "window": &windowLua, "ban": &banLua,
			"blocksize": &blockSizeLua, "decide": &decideFnLua, "run": &runLua} {
			b, err := os.ReadFile(filepath.Join(dir, name+".lua"))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			*v = string(b)
		}
		decideCore = joinDecisionCode()
		decideLua = asScript(decideCore)
	}
	os.Exit(m.Run())
}
