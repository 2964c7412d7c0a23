package ratelimit

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/animal-store/petstore/internal/testenv"
)

// BenchmarkRedisInstructions counts the instructions a redis-server runs
// per decision (valgrind's callgrind; user space only), which, unlike
// time, is the same on a busy machine as on a quiet one: a change to the
// decision code can be judged by one run of each side. Run it alone,
// once per case:
//
//	go test ./ratelimit -run '^$' -bench RedisInstructions -benchtime 1x
//
// The decisions are the business plan's (a minute and a day, no bans)
// for 2,000 keys, 8 to a call, in a pass a minute bucket (300 ms) after
// the key's previous one, so that every decision moves its minute
// window's head: the cold-key workload's decision. Cases:
//
//   - fresh: each key's first decision (records created whole).
//   - head-moved: the cold decision; 7 commands (GETRANGE the two
//     headers and the slots leaving the minute window, SETRANGE the slot
//     the old head leaves and both headers, PEXPIRE the minute record).
//   - head-moved-alone: the same, one decision per call: what a call's
//     fixed cost adds.
//   - head-moved-banplan: the plan with a ban rule (a third record read).
//   - floor-7-commands: the head-moved decision's seven commands on the
//     same records from Lua with no decision logic (same keys, arguments
//     and reply size): what any Lua code pays for this record format.
//   - floor-4-commands: one header read and write and one slot read and
//     write a decision: the commands of a format keeping a key's window
//     headers together and refreshing TTLs rarely.
//   - floor-no-commands: the call, its arguments and a reply per decision.
func BenchmarkRedisInstructions(b *testing.B) {
	testenv.RedisAddr(b)
	for _, tool := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			if testenv.InCI() {
				b.Fatalf("%s not installed: %v", tool, err)
			}
			b.Skipf("%s not installed: %v", tool, err)
		}
	}
	cg := startCallgrindRedis(b)
	ctx := context.Background()
	sc := decisionScript()
	if err := cg.rdb.FunctionLoadReplace(ctx, sc.library).Err(); err != nil {
		b.Fatal(err)
	}
	if err := cg.rdb.FunctionLoadReplace(ctx, floorLibrary).Err(); err != nil {
		b.Fatal(err)
	}
	business := compile(benchPlans[2], DefaultBuckets, DefaultStrikeBuckets)
	banPlan := compile(withBan(benchPlans[2]), DefaultBuckets, DefaultStrikeBuckets)

	const keys = 2000
	cases := []struct {
		name string
		pl   *plan
		per  int
		warm int    // uninstrumented passes before the measured one
		fn   string // "" for the decision code
	}{
		{"fresh", business, 8, 0, ""},
		{"head-moved", business, 8, 2, ""},
		{"head-moved-alone", business, 1, 2, ""},
		{"head-moved-banplan", banPlan, 8, 2, ""},
		{"floor-7-commands", business, 8, 2, "floor_7"},
		{"floor-4-commands", business, 8, 2, "floor_4"},
		{"floor-no-commands", business, 8, 2, "floor_0"},
	}
	for ci, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var total int64
			for it := range b.N {
				prefix := fmt.Sprintf("petstore:rl:i%d.%d:", ci, it)
				pass := func(fn string, measured bool) {
					if measured {
						cg.control(b, "-i", "on")
					}
					for k := 0; k < keys; k += c.per {
						ds := make([]decision, 0, c.per)
						for j := k; j < k+c.per && j < keys; j++ {
							ds = append(ds, decision{keys: stateKeys(prefix, "k"+strconv.Itoa(j), c.pl), pl: c.pl, nums: scriptNums(c.pl, input{lease: noLease})})
						}
						ks, args := batchCommand(ds)
						if err := cg.rdb.FCall(ctx, fn, ks, args...).Err(); err != nil {
							b.Fatal(err)
						}
					}
					if measured {
						cg.control(b, "-i", "off")
					}
				}
				for range c.warm {
					pass(sc.fn, false)
					time.Sleep(400 * time.Millisecond)
				}
				fn := c.fn
				if fn == "" {
					fn = sc.fn
				}
				pass(fn, true)
				total += cg.dump(b)
			}
			b.ReportMetric(float64(total)/float64(b.N*keys), "instr/decision")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// callgrindRedis is a redis-server run under callgrind with
// instrumentation off until asked (control), each dump (dump) holding
// what ran since the one before.
type callgrindRedis struct {
	cmd   *exec.Cmd
	out   string
	dumps int
	rdb   *redis.Client
}

func startCallgrindRedis(b *testing.B) *callgrindRedis {
	b.Helper()
	dir := b.TempDir()
	port := testenv.FreePort(b)
	cg := &callgrindRedis{out: filepath.Join(dir, "callgrind.out")}
	// hz 1: the server's timer work (every 1/hz s) would count beside
	// the decisions, in proportion to valgrind's slowness.
	cg.cmd = exec.Command("valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file="+cg.out,
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1", "--dir", dir)
	if err := cg.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cg.cmd.Process.Kill()
		_ = cg.cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("redis-server under valgrind did not start: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cg.rdb = redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	b.Cleanup(func() { _ = cg.rdb.Close() })
	if err := cg.rdb.Ping(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	return cg
}

func (cg *callgrindRedis) control(b *testing.B, args ...string) {
	b.Helper()
	out, err := exec.Command("callgrind_control", append(args, strconv.Itoa(cg.cmd.Process.Pid))...).CombinedOutput()
	if err != nil {
		b.Fatalf("callgrind_control %v: %v\n%s", args, err, out)
	}
}

// dump returns the instructions counted since the last dump.
func (cg *callgrindRedis) dump(b *testing.B) int64 {
	b.Helper()
	cg.control(b, "-d")
	cg.dumps++
	file := cg.out + "." + strconv.Itoa(cg.dumps)
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(file)
		if err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if v, ok := strings.CutPrefix(line, "totals: "); ok {
					n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					if err != nil {
						b.Fatalf("%s: %q: %v", file, line, err)
					}
					return n
				}
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("no totals in %s: %v", file, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// floorLibrary holds the reference calls of BenchmarkRedisInstructions:
// the commands of a decision with no decision logic. They take the
// decision code's KEYS and ARGV (a decision's keys are its ban record, its
// minute and its day record) and reply 72 bytes a decision, as the
// decision code does for this plan.
const floorLibrary = "#!lua name=petstore_ratelimit_floor\n" + `
local REPLY = '` + "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" + `'
redis.register_function('floor_0', function(keys, args)
  redis.call('TIME')
  local out = {}
  for d = 1, #keys, 3 do out[#out + 1] = REPLY end
  return out
end)
redis.register_function('floor_7', function(keys, args)
  local call, sub = redis.call, string.sub
  call('TIME')
  local out = {}
  for d = 1, #keys, 3 do
    local km, kd = keys[d + 1], keys[d + 2]
    local h = call('GETRANGE', km, '0', '18')
    local s = call('GETRANGE', km, '20', '31')
    call('SETRANGE', km, '20', s)
    call('SETRANGE', km, '1', sub(h, 2))
    call('PEXPIRE', km, '60600')
    local h2 = call('GETRANGE', kd, '0', '18')
    call('SETRANGE', kd, '1', sub(h2, 2))
    out[#out + 1] = REPLY
  end
  return out
end)
redis.register_function('floor_4', function(keys, args)
  local call, sub = redis.call, string.sub
  call('TIME')
  local out = {}
  for d = 1, #keys, 3 do
    local km = keys[d + 1]
    local h = call('GETRANGE', km, '0', '37')
    local s = call('GETRANGE', km, '40', '51')
    call('SETRANGE', km, '40', s)
    call('SETRANGE', km, '1', sub(h, 2))
    out[#out + 1] = REPLY
  end
  return out
end)
`
