package ratelimit

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/animal-store/petstore/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// newMini starts a miniredis whose clock (TIME and TTLs) the test moves.
func newMini(t *testing.T, start time.Time) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(start)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return m, rdb
}

func evalScript(t *testing.T, rdb *redis.Client, key string, pl *plan, in input) verdict {
	t.Helper()
	reply, err := evalDecision(context.Background(), rdb, stateKeys("t:", key, pl), pl, in)
	if err != nil {
		t.Fatalf("eval: %v", err)
	}
	v, err := decode(pl, reply)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestScriptMatchesReference drives the Lua script and the Go reference
// with the same random traffic and clock and requires identical answers.
func TestScriptMatchesReference(t *testing.T) {
	t.Parallel()
	policies := []Policy{
		{Name: "small", Windows: []Window{{Limit: 5, Period: time.Second}, {Limit: 12, Period: 5 * time.Second}},
			Ban:       BanPolicy{Threshold: 6, StrikeWindow: 3 * time.Second, Base: 2 * time.Second, Multiplier: 2, Max: 7 * time.Second, Memory: 20 * time.Second},
			Candidate: []Window{{Limit: 3, Period: time.Second}}, CandidateBan: BanPolicy{Threshold: 4, StrikeWindow: 2 * time.Second, Base: time.Second, Multiplier: 3, Max: 5 * time.Second, Memory: 10 * time.Second}},
		{Name: "odd", Windows: []Window{{Limit: 30, Period: 1013 * time.Millisecond}}},
		{Name: "wide", Windows: []Window{{Limit: 70000, Period: 2 * time.Second}, {Limit: 3, Period: 10 * time.Millisecond}},
			Ban: BanPolicy{Threshold: 1, StrikeWindow: 50 * time.Millisecond, Base: time.Millisecond}},
	}
	for _, p := range policies {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
			m, rdb := newMini(t, start)
			pl := compile(p, 10, 4)
			ref := &keyState{}
			rng := rand.New(rand.NewPCG(1, uint64(len(p.Name))))
			now := start
			var seen [3]int
			newBans, leases := 0, 0
			for i := range 3000 {
				// Mostly small steps, sometimes long idle gaps.
				switch r := rng.IntN(100); {
				case r < 70:
					now = now.Add(time.Duration(rng.IntN(3000)) * time.Microsecond)
				case r < 97:
					now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
				default:
					now = now.Add(time.Duration(rng.IntN(20)) * time.Second)
				}
				m.SetTime(now)
				mode, extra, add, ask := randomRequest(rng, 400_000)
				got := evalScript(t, rdb, "k", pl, input{peek: mode == modePeek, extra: extra, add: add, lease: ask})
				want := ref.decide(pl, now.UnixMicro(), input{peek: mode == modePeek, extra: extra, add: add, lease: ask})
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d at %s (mode %d extra %d):\nscript    %+v\nreference %+v", i, now.Format(time.RFC3339Nano), mode, extra, got, want)
				}
				seen[got.outcome]++
				if got.granted > 1 {
					leases++
				}
				if got.newBan {
					newBans++
				}
			}
			t.Logf("outcomes %v, bans %d, leases %d", seen, newBans, leases)
			if seen[Allowed] == 0 || seen[Limited] == 0 || (p.Ban.Enabled() && (seen[Banned] == 0 || newBans < 2)) || leases == 0 {
				t.Errorf("traffic did not exercise every outcome: %v, %d bans, %d leases", seen, newBans, leases)
			}
		})
	}
}

// TestCodecMatchesStruct checks the Lua fallback of lua/codec.lua (what
// miniredis runs, and so what TestScriptMatchesReference checks) against
// Redis's struct library (what production runs), on random values of
// every width the script uses.
func TestCodecMatchesStruct(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	fallback := strings.Replace(codecLua, "rawget(_G, 'struct')", "nil", 1)
	if fallback == codecLua {
		t.Fatal("codecLua no longer looks up struct as expected")
	}
	src := fallback + "\nlocal unpack_, pack_ = codec()\n" + `
local vals = {}
for i = 2, #ARGV do vals[i - 1] = tonumber(ARGV[i]) end
local a, b = pack_(ARGV[1], unpack(vals)), struct.pack(ARGV[1], unpack(vals))
local out = {a, b}
if not string.find(ARGV[1], 'i') then
  local ua, ub = {unpack_(ARGV[1], b, 1)}, {struct.unpack(ARGV[1], b, 1)}
  for i = 1, #ua do out[#out + 1] = string.format('%.0f/%.0f', ua[i], ub[i]) end
end
return out`
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		format := ">"
		args := []any{""}
		var want []int64
		for range 1 + rng.IntN(8) {
			w := 1 + rng.IntN(8)
			hi := int64(1) << min(8*w, 53)
			v := rng.Int64N(hi)
			switch rng.IntN(4) {
			case 0:
				v = hi - 1
			case 1:
				v = 0
			}
			format += "I" + strconv.Itoa(w)
			args = append(args, v)
			want = append(want, v)
		}
		if rng.IntN(3) == 0 {
			// Reply fields: signed, 8 bytes, never read back by Lua.
			format = ">i8i8i8"
			args = []any{"", -rng.Int64N(1 << 53), rng.Int64N(1 << 53), int64(-1)}
			want = nil
		}
		args[0] = format
		res, err := rdb.Eval(context.Background(), src, nil, args...).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != res[1] {
			t.Fatalf("%s %v: pack_ %x, struct.pack %x", format, args[1:], res[0], res[1])
		}
		for i, v := range want {
			if got, exp := res[2+i], strconv.FormatInt(v, 10)+"/"+strconv.FormatInt(v, 10); got != exp {
				t.Fatalf("%s %v: field %d: unpack_/struct.unpack %s, want %s", format, args[1:], i, got, exp)
			}
		}
		if want != nil && len(res) != 2+len(want)+1 {
			t.Fatalf("%s: %d values back, want %d and the next position", format, len(res)-2, len(want))
		}
	}
}

// TestScriptMatchesReferenceOnRedis drives the script on a real Redis
// (with struct, which miniredis lacks) and the Go reference at
// the time the script saw, with the same random traffic, and requires
// identical answers. Windows of tens of milliseconds let real time move
// their heads by one bucket and by several.
func TestScriptMatchesReferenceOnRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	policies := []Policy{
		{Name: "tight", Windows: []Window{{Limit: 8, Period: 100 * time.Millisecond}, {Limit: 40, Period: 500 * time.Millisecond}},
			Ban: BanPolicy{Threshold: 5, StrikeWindow: 300 * time.Millisecond, Base: 50 * time.Millisecond, Multiplier: 2, Max: 200 * time.Millisecond, Memory: time.Second}},
		{Name: "roomy", Windows: []Window{{Limit: 300, Period: 200 * time.Millisecond}, {Limit: 2000, Period: 800 * time.Millisecond}},
			Ban: BanPolicy{Threshold: 100, StrikeWindow: time.Second, Base: time.Second}},
	}
	for _, p := range policies {
		t.Run(p.Name, func(t *testing.T) {
			t.Parallel()
			pl := compile(p, 10, 4)
			keys := stateKeys(randomPrefix(t), "k", pl)
			ref := &keyState{}
			rng := rand.New(rand.NewPCG(5, uint64(len(p.Name))))
			var seen [3]int
			leases := 0
			for i := range 400 {
				switch r := rng.IntN(100); {
				case r < 60:
				case r < 95:
					time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
				default:
					time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
				}
				mode, extra, add, ask := randomRequest(rng, 40_000)
				reply, err := evalDecision(context.Background(), rdb, keys, pl, input{peek: mode == modePeek, extra: extra, add: add, lease: ask})
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				got, err := decode(pl, reply)
				if err != nil {
					t.Fatal(err)
				}
				want := ref.decide(pl, got.now, input{peek: mode == modePeek, extra: extra, add: add, lease: ask})
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (mode %d extra %d):\nscript    %+v\nreference %+v", i, mode, extra, got, want)
				}
				seen[got.outcome]++
				if got.granted > 1 {
					leases++
				}
			}
			t.Logf("outcomes %v, leases %d", seen, leases)
			// "tight" must see every outcome; "roomy" stays far from its
			// limits, where the script reads and writes the least.
			if seen[Allowed] == 0 || leases == 0 || (p.Name == "tight" && (seen[Limited] == 0 || seen[Banned] == 0)) {
				t.Errorf("traffic did not exercise every outcome: %v, %d leases", seen, leases)
			}
		})
	}
}

// randomRequest draws one call of the differential tests: mostly
// decisions, some peeks, some with pending strikes, and some decisions
// asking for a lease of every size and need (granted or not) with a life
// of up to maxLife µs, so shorter and longer than a bucket.
func randomRequest(rng *rand.Rand, maxLife int) (mode, extra int64, add []int64, ask leaseAsk) {
	mode, ask = modeDecide, noLease
	if rng.IntN(10) == 0 {
		mode = modePeek
	}
	if rng.IntN(20) == 0 {
		extra = int64(rng.IntN(4))
	}
	if rng.IntN(25) == 0 {
		// Per window (at most four): some windows get none.
		add = []int64{int64(rng.IntN(40)), int64(rng.IntN(40)), int64(rng.IntN(40)), int64(rng.IntN(40))}
	}
	if mode == modeDecide && rng.IntN(3) == 0 {
		w := int64(2 + rng.IntN(12))
		ask = leaseAsk{want: w, need: w * int64(1+rng.IntN(3)), life: int64(1 + rng.IntN(maxLife))}
	}
	return mode, extra, add, ask
}

// TestCountsSumsSlots checks the script's counts directly: for any run of
// a ring's slots it returns the sum of their counts, whatever bytes the
// ring holds. It skips runs it finds zero without decoding them, so the
// rings generated are mostly zero, with counts and offsets whose bytes
// put runs of zeros anywhere inside a slot (a count of 256 or 1<<24, an
// offset of zero), dense rings, and rings behind a prefix of other
// bytes, as the script reads them (a record's header, a run of slots cut
// out of the ring). On miniredis (the codec in Lua) and on Redis
// (struct).
func TestCountsSumsSlots(t *testing.T) {
	t.Parallel()
	src := decideCore + `
init()
local A = _G.ARGV
return tostring(counts(A[1], tonumber(A[2]), tonumber(A[3]), tonumber(A[4])))`
	_, mini := newMini(t, time.Unix(1_700_000_000, 0))
	onRedis := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = onRedis.Close() })
	rng := rand.New(rand.NewPCG(7, 8))
	counts := []uint32{1, 2, 255, 256, 257, 65535, 65536, 1 << 24, maxCount}
	for c := range 600 {
		n := 1 + rng.IntN(240)
		density := []int{0, 1, 3, 20, 100}[rng.IntN(5)]
		prefix := make([]byte, rng.IntN(3*slotBytes+1))
		for i := range prefix {
			prefix[i] = byte(rng.IntN(256))
		}
		ring := make([]byte, (n+1)*slotBytes)
		for i := 0; i <= n; i++ {
			if rng.IntN(100) >= density {
				continue
			}
			var v uint32
			if rng.IntN(2) == 0 {
				v = counts[rng.IntN(len(counts))]
			} else {
				v = rng.Uint32()
			}
			off := uint16(0)
			if rng.IntN(2) == 0 {
				off = uint16(rng.IntN(1 << 16))
			}
			binary.BigEndian.PutUint32(ring[i*slotBytes:], v)
			binary.BigEndian.PutUint16(ring[i*slotBytes+countBytes:], off)
		}
		i0 := rng.IntN(n + 1)
		i1 := i0 + rng.IntN(n+1-i0)
		var want uint64
		for i := i0; i <= i1; i++ {
			want += uint64(binary.BigEndian.Uint32(ring[i*slotBytes:]))
		}
		s := string(prefix) + string(ring)
		R := len(prefix) + 1
		for _, rdb := range []*redis.Client{mini, onRedis} {
			if rdb == onRedis && c%4 != 0 {
				continue
			}
			got, err := rdb.Eval(context.Background(), src, nil, s, R, i0, i1).Text()
			if err != nil {
				t.Fatal(err)
			}
			if got != strconv.FormatUint(want, 10) {
				t.Fatalf("case %d (n %d, density %d%%, prefix %d bytes): counts of slots %d..%d = %s, want %d\nring %x",
					c, n, density, len(prefix), i0, i1, got, want, ring)
			}
		}
	}
}
