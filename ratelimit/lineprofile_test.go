package ratelimit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/animal-store/petstore/internal/testenv"
)

// BenchmarkLuaLineProfile counts the Lua interpreter instructions the
// decision code runs per decision, by function and by line, under
// Debian's lua5.1 with a count hook (testdata/lineprofile.lua): the same
// head-moved pass as BenchmarkRedisInstructions (1,000 keys of the
// business plan, 8 a call, heads moved three buckets), with Redis's
// commands and struct codec stood in for and left out of the count. It
// tells where the decision code's own Lua goes, which callgrind on
// Redis's stripped interpreter cannot; beside it, the flat sketch of
// BenchmarkRedisInstructions for comparison. Measured: about 55 of Redis's
// machine instructions per interpreter instruction.
//
//	go test ./ratelimit -run '^$' -bench LuaLineProfile -benchtime 1x -v
func BenchmarkLuaLineProfile(b *testing.B) {
	lua, err := exec.LookPath("lua5.1")
	if err != nil {
		if testenv.InCI() {
			b.Fatalf("lua5.1 not installed: %v", err)
		}
		b.Skipf("lua5.1 not installed (Debian's lua5.1): %v", err)
	}
	harness, err := filepath.Abs("testdata/lineprofile.lua")
	if err != nil {
		b.Fatal(err)
	}
	pl := compile(benchPlans[2], DefaultBuckets, DefaultStrikeBuckets)
	const keys, per = 1000, 8
	var data strings.Builder
	data.WriteString("BATCHES = {\n")
	var args []any
	for k := 0; k < keys; k += per {
		var ds []decision
		for j := k; j < k+per; j++ {
			ds = append(ds, decision{keys: stateKeys("p:", "k"+strconv.Itoa(j), pl), pl: pl, nums: scriptNums(pl, input{lease: noLease})})
		}
		var ks []string
		ks, args = batchCommand(ds)
		data.WriteString("{")
		for _, key := range ks {
			data.WriteString(luaString(key) + ",")
		}
		data.WriteString("},\n")
	}
	data.WriteString("}\nARGV = {")
	for _, a := range args {
		switch v := a.(type) {
		case string:
			data.WriteString(luaString(v) + ",")
		case []byte:
			data.WriteString(luaString(string(v)) + ",")
		default:
			b.Fatalf("argument %T", a)
		}
	}
	fmt.Fprintf(&data, "}\nCODE = %s\nREF = %s\nKEYS_PER_DECISION = %d\nPASSES, STEP, TOP = 3, 900000, 30\n",
		luaString(decideCore), luaString(floorLibrary[strings.Index(floorLibrary, "\n")+1:]), len(stateKeys("p:", "k", pl)))
	for _, c := range []struct{ name, fn string }{{"decision", ""}, {"flat-logic-sketch", "flat_sketch"}} {
		b.Run(c.name, func(b *testing.B) {
			file := filepath.Join(b.TempDir(), "data.lua")
			src := data.String()
			if c.fn != "" {
				src += "FN = " + luaString(c.fn) + "\n"
			}
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				b.Fatal(err)
			}
			var total float64
			for range b.N {
				out, err := exec.Command(lua, harness, file).CombinedOutput()
				if err != nil {
					b.Fatalf("lua5.1: %v\n%s", err, out)
				}
				first, _, _ := strings.Cut(string(out), "\n")
				v, ok := strings.CutPrefix(first, "total ")
				if !ok {
					b.Fatalf("no total in:\n%s", out)
				}
				if total, err = strconv.ParseFloat(v, 64); err != nil {
					b.Fatal(err)
				}
				b.Logf("interpreter instructions a decision, by function (the line it starts at) and by line:\n%s", out)
			}
			b.ReportMetric(total, "lua-instr/decision")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// luaString quotes s as a Lua 5.1 string literal, every byte outside
// printable ASCII (and the quote and backslash) as a decimal escape.
func luaString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "\\%03d", c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
