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
// With BENCH_CALLGRIND_DIR set, the dumps stay there: callgrind_annotate
// on one of them tells which of the server's functions ran the
// instructions (the Lua interpreter, its garbage collector, commands).
//
// The decisions are the business plan's (a minute and a day, no bans)
// for 1,000 keys, 8 to a call, each a pass and a pause (a few minute
// buckets of 300 ms) after the key's previous one, so that every decision
// moves its minute window's head: the cold-key workload's decision.
// Counts vary by a few percent from run to run with how far the heads
// move. Cases:
//
//   - fresh: each key's first decision (records created whole).
//   - expired: a key that calls less often than once a period, here of
//     a one-second window beside the day: that window's record expired
//     since the key's previous decision and is created anew; the day's
//     is read and written as a cold key's (BenchmarkSparseKeys, expired).
//   - long-lived: the cold decision of a key active for longer than a
//     bucket of its longest window, here an hour (18-second buckets)
//     beside the minute: that window's head stays, but its events span
//     two buckets, so its oldest slot is read too (a day window does
//     the same once a key has been active for 7.2 minutes), 8 commands.
//   - returning: a key that calls about every half period, here of a
//     ten-second window beside the day: the head moves over a hundred
//     mostly empty buckets, which leave the window and are read and
//     summed (BenchmarkSparseKeys, returning).
//   - head-moved: the cold decision; 7 commands (GETRANGE the two
//     headers and the slots leaving the minute window, SETRANGE the slot
//     the old head leaves and both headers, PEXPIRE the minute record).
//   - head-moved-alone: the same, one decision per call: what a call's
//     fixed cost adds.
//   - head-moved-banplan: the plan with a ban rule (a third record read).
//   - head-moved-3windows: a minute, an hour and a day, no ban rule (the
//     hour's and the day's headers read and written too).
//   - head-moved-five: five seconds beside the day, no block asked.
//   - head-moved-blocks: head-moved with blocks in force (lease.go): the
//     minute window's coarse record read too.
//   - head-moved-five-blocks-ride: head-moved-five with blocks in force,
//     asked for a block and granted one, counted in the day window and
//     the five seconds' coarse record.
//   - head-moved-short-one, head-moved-short-two (and -blocks): plans
//     of short windows alone, a minute, and ten seconds beside a minute,
//     without and with blocks in force, where they read their windows'
//     coarse records too (another plan of the key may count blocks
//     there): the cost of that read.
//   - floor-7-commands: the head-moved decision's seven commands on the
//     same records from Lua with no decision logic (same keys, arguments
//     and reply size): what any Lua code pays for this record format.
//   - flat-logic-sketch: the seven commands and the arithmetic a
//     head-moved decision of this plan needs (headers, leaving slots,
//     the oldest slot, the limits, the writes, the reply), written flat
//     for this plan alone: what a decision path specialized to plans
//     without bans, candidates, leases or seeding might cost. Not a
//     limiter (it assumes the head moved, skips the rare cases) and
//     never used as one; a yardstick for such a path.
//   - floor-4-commands: one header read and write and one slot read and
//     write a decision: the commands of a format keeping a key's window
//     headers together and refreshing TTLs rarely.
//   - floor-no-commands: the call, its arguments and a reply per decision.
func BenchmarkRedisInstructions(b *testing.B) {
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
	second := compile(Policy{Name: "second", Windows: []Window{{Limit: 1000, Period: time.Second}, {Limit: 100_000, Period: 24 * time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	ten := compile(Policy{Name: "ten", Windows: []Window{{Limit: 1000, Period: 10 * time.Second}, {Limit: 100_000, Period: 24 * time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	hour := compile(Policy{Name: "hour", Windows: []Window{{Limit: 1000, Period: time.Minute}, {Limit: 100_000, Period: time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	three := compile(Policy{Name: "three", Windows: []Window{{Limit: 1000, Period: time.Minute}, {Limit: 20_000, Period: time.Hour}, {Limit: 100_000, Period: 24 * time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	// five: a short window short enough that the warm passes' three
	// requests earn a block (3 × 10 s / 5 s = 6).
	five := compile(Policy{Name: "five", Windows: []Window{{Limit: 1000, Period: 5 * time.Second}, {Limit: 100_000, Period: 24 * time.Hour}}}, DefaultBuckets, DefaultStrikeBuckets)
	// Plans of short windows alone (no long window, so no block of their
	// own), which with blocks in force read their windows' coarse records
	// too (plan.split): one window and two.
	minute := compile(Policy{Name: "minute", Windows: []Window{{Limit: 1000, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	tenMinute := compile(Policy{Name: "ten-minute", Windows: []Window{{Limit: 100, Period: 10 * time.Second}, {Limit: 1000, Period: time.Minute}}}, DefaultBuckets, DefaultStrikeBuckets)
	business.split()
	banPlan.split()
	five.split()
	minute.split()
	tenMinute.split()

	const keys = 1000
	cases := []struct {
		name  string
		pl    *plan
		per   int
		warm  int           // passes before the measured one (counted, then dropped)
		fn    string        // "" for the decision code
		pause time.Duration // after each warm pass
		// align, when set, starts each warm pass half a second into a
		// bucket of this width, the first in the next bucket, each later
		// one in the bucket after the previous one's; the pause then
		// follows the last warm pass only.
		align time.Duration
	}{
		{"fresh", business, 8, 0, "", 0, 0},
		{"expired", second, 8, 1, "", time.Second + 3*time.Second/DefaultBuckets + 10*time.Millisecond, 0},
		{"long-lived", hour, 8, 2, "", 300 * time.Millisecond, time.Hour / DefaultBuckets},
		{"returning", ten, 8, 2, "", 5 * time.Second, 0},
		{"head-moved", business, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-alone", business, 1, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-banplan", banPlan, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-3windows", three, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-five", five, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-blocks", business, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-five-blocks-ride", five, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-short-one", minute, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-short-one-blocks", minute, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-short-two", tenMinute, 8, 2, "", 300 * time.Millisecond, 0},
		{"head-moved-short-two-blocks", tenMinute, 8, 2, "", 300 * time.Millisecond, 0},
		{"floor-7-commands", business, 8, 2, "floor_7", 300 * time.Millisecond, 0},
		{"flat-logic-sketch", business, 8, 2, "flat_sketch", 300 * time.Millisecond, 0},
		{"floor-4-commands", business, 8, 2, "floor_4", 300 * time.Millisecond, 0},
		{"floor-no-commands", business, 8, 2, "floor_0", 300 * time.Millisecond, 0},
	}
	for ci, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var total int64
			for it := range b.N {
				prefix := fmt.Sprintf("petstore:rl:i%d.%d:", ci, it)
				var rsv *blockAsk
				if strings.Contains(c.name, "-ride") {
					// Asked for a block as a replica alone would ask; the
					// measured pass is asked, the warm ones too.
					rsv = &blockAsk{max: 64, replicas: 1}
				}
				// With blocks in force, the plan with its coarse records
				// (its numbers asked as the plan's own).
				cp := c.pl
				if strings.Contains(c.name, "-blocks") {
					cp = c.pl.blk
				}
				pass := func(fn string) {
					for k := 0; k < keys; k += c.per {
						ds := make([]decision, 0, c.per)
						for j := k; j < k+c.per && j < keys; j++ {
							ds = append(ds, decision{keys: stateKeys(prefix, "k"+strconv.Itoa(j), cp), pl: cp, nums: scriptNums(c.pl, input{lease: noLease, block: rsv})})
						}
						ks, args := batchCommand(ds)
						if err := cg.rdb.FCall(ctx, fn, ks, args...).Err(); err != nil {
							b.Fatal(err)
						}
					}
				}
				// Every pass runs instrumented, at the same (slow) pace, so
				// that each key's decisions are the same time apart: a
				// pass plus the pause, a few minute buckets. What the warm
				// passes ran is dumped and dropped.
				cg.control(b, "-i", "on")
				for w := range c.warm {
					if c.align > 0 {
						g := c.align.Microseconds()
						time.Sleep(time.Until(time.UnixMicro((time.Now().UnixMicro()/g+1)*g + 500_000)))
					}
					pass(sc.fn)
					if c.align == 0 || w == c.warm-1 {
						time.Sleep(c.pause)
					}
				}
				if c.warm > 0 {
					cg.dump(b)
				}
				fn := c.fn
				if fn == "" {
					fn = sc.fn
				}
				pass(fn)
				cg.control(b, "-i", "off")
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

// startCallgrindRedis starts a redis-server under callgrind, skipping the
// benchmark (failing it in CI) without the tools.
func startCallgrindRedis(b *testing.B) *callgrindRedis {
	b.Helper()
	testenv.RedisAddr(b)
	for _, tool := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			if testenv.InCI() {
				b.Fatalf("%s not installed: %v", tool, err)
			}
			b.Skipf("%s not installed: %v", tool, err)
		}
	}
	dir := b.TempDir()
	// BENCH_CALLGRIND_DIR keeps the dumps, one per measured pass and one
	// per warm-up (callgrind.out.N, in order), for callgrind_annotate.
	if d := os.Getenv("BENCH_CALLGRIND_DIR"); d != "" {
		dir = d
	}
	port := testenv.FreePort(b)
	cg := &callgrindRedis{out: filepath.Join(dir, "callgrind.out")}
	// hz 1: the server's timer work (every 1/hz s) would count beside
	// the decisions, in proportion to valgrind's slowness.
	cg.cmd = exec.Command("valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file="+cg.out,
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1", "--dir", dir)
	testenv.EndWithTest(cg.cmd)
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
// the commands of a decision with no decision logic, and the flat sketch.
// They take the decision code's KEYS and ARGV (a decision's keys are its
// ban record, its minute and its day record) and reply 40 bytes a
// decision, as the decision code does for this plan (its short reply).
const floorLibrary = "#!lua name=petstore_ratelimit_floor\n" + `
local REPLY = '` + "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" + `'
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
local OFF = {}
local function ofs(v) local o = OFF[v]; if not o then o = string.format('%d', v); OFF[v] = o end; return o end
local ZEROS = {}
redis.register_function('flat_sketch', function(keys, args)
  local call, u, p, rep = redis.call, struct.unpack, struct.pack, string.rep
  local t = call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local calls, pos = args[1], 1
  local V = {u('>' .. rep('I8', #args[3] / 8), args[3], 1)}
  local l1, P1, g1, n1, u1, ttl1 = V[2], V[3], V[4], V[5], V[6], tostring(V[7])
  local l2, P2, g2, n2, u2 = V[8], V[9], V[10], V[11], V[12]
  local out = {}
  for d = 1, #keys, 3 do
    local nk, pl, na
    nk, pl, na, pos = u('>I8I8I8', calls, pos)
    local km, kd = keys[d + 1], keys[d + 2]
    local h = call('GETRANGE', km, '0', '18')
    local vh, total, hc, ho = u('>I8I4I4I2', h, 2)
    local b = (now - now % g1) / g1
    local lo = vh - n1
    local si, k = lo % (n1 + 1), b - n1 - lo + 1
    if si + k > n1 + 1 then si, k = 0, n1 + 1 end
    local s = call('GETRANGE', km, ofs(19 + si * 6), ofs(18 + (si + k) * 6))
    for q = 1, (k - 1) * 6, 6 do total = total - u('>I4', s, q) end
    local c0, o0 = u('>I4I2', s, (k - 1) * 6 + 1)
    local used1 = total
    if c0 > 0 and (b - n1) * g1 + o0 * u1 + P1 <= now then used1 = total - c0 end
    local admit = used1 < l1
    local z = ZEROS[k]
    if not z then z = rep('\0', (b - vh - 1) * 6); ZEROS[k] = z end
    call('SETRANGE', km, ofs(19 + (vh % (n1 + 1)) * 6), p('>I4I2', hc, ho) .. z)
    local dd = now - b * g1
    local off = (dd + u1 - 1 - (dd + u1 - 1) % u1) / u1
    call('SETRANGE', km, '1', p('>I8I4I4I2', b, total + 1, 1, off))
    call('PEXPIRE', km, ttl1)
    local h2 = call('GETRANGE', kd, '0', '18')
    local vh2, total2, hc2, ho2 = u('>I8I4I4I2', h2, 2)
    local used2 = total2
    admit = admit and used2 < l2
    local d2 = now - vh2 * g2
    local off2 = (d2 + u2 - 1 - (d2 + u2 - 1) % u2) / u2
    call('SETRANGE', kd, '1', p('>I8I4I4I2', vh2, total2 + 1, hc2 + 1, off2))
    out[#out + 1] = p('>i8i8i8i8i8', now, used1 + 1, b * g1 + P1, used2 + 1, vh2 * g2 + P2)
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

// BenchmarkGiveBackInstructions counts, as BenchmarkRedisInstructions
// does, the instructions a redis-server runs per give-back (giveback.go):
// 1,000 keys of the business plan each leased 20, their minute heads
// moved on by a decision 400 ms later, then 5 of each lease given back
// (from a slot of the minute window and the head of the day's), one
// give-back a call (alone) or as the sender batches them, 64 a call
// (batched).
//
//	go test ./ratelimit -run '^$' -bench GiveBackInstructions -benchtime 1x
func BenchmarkGiveBackInstructions(b *testing.B) {
	cg := startCallgrindRedis(b)
	ctx := context.Background()
	if err := giveBackScript.Load(ctx, cg.rdb).Err(); err != nil {
		b.Fatal(err)
	}
	business := compile(benchPlans[2], DefaultBuckets, DefaultStrikeBuckets)
	const keys = 1000
	for ci, per := range []int{1, giveBackBatch} {
		name := "alone"
		if per > 1 {
			name = "batched"
		}
		b.Run(name, func(b *testing.B) {
			var total int64
			for it := range b.N {
				prefix := fmt.Sprintf("petstore:rl:g%d.%d:", ci, it)
				decide := func(ask leaseAsk) []int64 {
					at := make([]int64, keys)
					for k := range keys {
						reply, err := evalDecision(ctx, cg.rdb, stateKeys(prefix, "k"+strconv.Itoa(k), business), business, input{lease: ask})
						if err != nil {
							b.Fatal(err)
						}
						v, err := decode(business, reply)
						if err != nil || v.outcome != Allowed || v.granted != ask.want {
							b.Fatalf("%+v %v: want %d granted", v, err, ask.want)
						}
						at[k] = v.now
					}
					return at
				}
				granted := decide(leaseAsk{want: 20, need: 20, life: 1_000_000})
				time.Sleep(400 * time.Millisecond)
				decide(noLease)
				cg.control(b, "-i", "on")
				for k := 0; k < keys; k += per {
					var gs []giveBack
					for j := k; j < k+per && j < keys; j++ {
						gs = append(gs, giveBack{key: "k" + strconv.Itoa(j), windows: business.windows, at: granted[j], n: 5})
					}
					ks, args := giveBackCommand(prefix, gs)
					taken, err := giveBackScript.EvalSha(ctx, cg.rdb, ks, args...).Int64Slice()
					if err != nil {
						b.Fatal(err)
					}
					for _, n := range taken {
						if n != 5 {
							b.Fatalf("took %d, want 5", n)
						}
					}
				}
				cg.control(b, "-i", "off")
				total += cg.dump(b)
			}
			b.ReportMetric(float64(total)/float64(b.N*keys), "instr/give-back")
			b.ReportMetric(0, "ns/op")
		})
	}
}
