package ratelimit

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

// decideCore decides a batch of requests atomically on the Redis server,
// in order, at one reading of the server's clock: for each, the same
// algorithm as keyState.decide (state.go), on the records format.go
// describes. One call serves every decision of a pipeline flush (of one
// Redis Cluster slot), so the call's fixed costs (TIME, Lua call setup,
// command dispatch, decoding each plan's numbers) are paid once per batch,
// not per decision. It runs as a Redis Function where the server has
// them (decideLibrary, FCALL), else as a script (decideLua, EVALSHA).
//
// The code is the Lua files under lua/, one chunk in the order
// decideCore lists them. Two paths make the same decisions through the
// same functions (window, write, resetAt, readCap, writeCap: each window
// rule is written once). decide (lua/decide.lua) serves every plan and
// every request. fast (lua/fast.lua) serves the common case, a cold or
// busy key of a plan of one to three windows, with or without a ban rule,
// and no candidate windows (with blocks, the first window's coarse
// record, if it alone has one), asked only to decide (with no strikes to
// count), not banned, and admitted, without what the rest of decide would
// cost it. Where decide would refuse, fast hands the request to decide
// before writing anything. TestFastPathDecidesAsDecide checks that both
// leave the same replies and bytes; the invariant tests check the
// windows' promise on both.
//
// Each decision reads the header of each of its windows' records
// (GETRANGE), then only the slots the decision needs (those that leave
// the window as its head moves, and the oldest still in it): every string
// that reaches Lua costs in proportion to its length (Redis's Lua hashes
// every byte of a string it makes), so the code reads, builds and compares
// as few bytes as it can. It writes only the bytes that change (SETRANGE), and
// sets a record's expiry when its head moves (once finalized, only when
// it moves into a new epoch: expiry, in the code); strikes rewrite the
// small ban record with its TTL. No key is ever left without a TTL. Decisions
// of one batch for the same key see each other's writes, in the batch's
// order.
//
// KEYS: each decision's records, one decision after the other: the ban
// record, the window records in the plan's order, the candidate window
// records, the candidate ban record (with a candidate ban policy), the
// coarse records of its short windows (on a plan with blocks, blocks.go),
// then the records of other periods it may take its past from or must
// also fit (seeding, registry.go; their indexes in the seeding numbers
// leave the coarse records out, and the script adds their count). All of one decision's records share its
// key's hash slot; in Redis Cluster a batch holds one slot.
//
// ARGV[1]: the decisions, 8-byte big-endian numbers each: how many KEYS
// it has, its plan (index among the plans below, from 1), how many
// numbers follow, then those: mode (0 decide, 1 peek, 2 decide and
// count a block), extra strikes, lease size wanted, lease room needed,
// lease life (µs) (in mode 2: the largest block, 1, the block's life,
// then the replicas, the margin, the least to grant, the round trips'
// allowance (µs) and how many of the plan's windows are short: blocks.go,
// reserveSize below), then, when any
// follow, per window the admissions made without Redis to record
// (input.add) and, when a plan edit changed periods, the seeding numbers
// (seeding.nums). None follow (0) for the most common request, asked to
// decide with no strikes and no lease: mode 0, extra 0 and a lease of
// one (want, need and life 1). ARGV[2]: when this release's records were
// finalized (µs, decimal; 0 when not, or not in force: finalize.go).
// ARGV[3p], ARGV[3p+1], ARGV[3p+2]: plan p's numbers packed, its ban multiplier and its candidate ban
// multiplier. The numbers: window count, per window limit, period, bucket
// width, n, offset unit (µs) and record TTL (ms); the ban rule (banRule.appendNums:
// threshold, 0 for none, then the strike window's period, bucket width,
// n, offset unit and TTL, the offence memory, the ban's base and max);
// the candidate window count and per candidate window the same six as a
// window; the candidate ban rule, like the ban rule; on a plan with blocks
// (blocks.go), the count of coarse records and per coarse record its
// window's index, period, bucket width, n, offset unit and TTL.
//
// Leases: an admission counts want admissions at once (a lease) when every
// window has at least need (>= want) remaining; they count in the current
// bucket of every window and may be spent until the lease ends: the end of
// the current bucket of every window, and at most life after now. The
// lease's end is recorded as the bucket's last event, and that time only
// ever grows. Otherwise one admission counts. A block (mode 2) rides on
// an admission: the request counts once in every window, and the block's
// admissions with it, at the block's end, in the long windows' own
// records and in the short ones' coarse records (blocks.go; asked of a
// plan without coarse records, the long windows alone: what the release
// before called a reservation); its size and end come back in a lease's
// fields (granted: 1 + the size).
//
// Reply: one string per decision, in order. A decision's string is 8-byte
// big-endian signed integers (decode reads it), in one of three forms.
// The short form is the reply to a request admitted alone (granted one
// admission, no lease) under a plan with no candidate windows, most
// requests' reply: now; with a ban rule the strikes, ban end and
// offences; then per window used and reset (outcome and retry are 0, the
// admissions granted 1, the lease end 0, no ban began). The bare form is
// the short one without the ban rule's fields, under a plan without one
// or when all three are 0 (a key with no ban record: most keys). Every
// other reply is the whole form, only the fields the plan has:
// outcome, retry, now, admissions granted, lease end; with a ban rule, new
// ban, strikes, ban end, offences; with candidate windows, what they would
// have decided for this request (outcome) and how many requests they
// admitted, limited and refused as banned, and with a candidate ban rule
// whether a candidate ban began, the candidate strikes, ban end and
// offences; then per window used and reset, then the same per candidate
// window. Times in µs. A decision that failed (a record of another type,
// say) is "E" and the error, and does not stop the others.
var decideCore = joinDecisionCode()

// joinDecisionCode joins the decision code's files in their order.
func joinDecisionCode() string {
	return codecLua + ringLua + windowLua + banLua + reserveLua + decideFnLua + fastLua + runLua
}

// The decision code's files, in the order they make one chunk: each
// uses the locals and functions of those before it. codec.lua starts
// every script.
var (
	//go:embed lua/codec.lua
	codecLua string
	//go:embed lua/ring.lua
	ringLua string
	//go:embed lua/window.lua
	windowLua string
	//go:embed lua/ban.lua
	banLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/decide.lua
	decideFnLua string
	//go:embed lua/fast.lua
	fastLua string
	//go:embed lua/run.lua
	runLua string
)

// decideLua is decideCore as a script (EVAL, EVALSHA): KEYS and ARGV are
// the script's globals.
var decideLua = asScript(decideCore)

func asScript(core string) string {
	return core + "\nreturn run(_G.KEYS, _G.ARGV)\n"
}

// decideLibrary returns decideCore as a Redis Function library (FUNCTION
// LOAD, FCALL) named lib, registering the function fn. Its code runs
// once, at load: every call then finds its helpers (and the plans and
// offsets it has decoded) ready, where a script re-creates them on every
// call; that is most of what a call costs when it decides few requests.
func decideLibrary(lib, fn string) string {
	return "#!lua name=" + lib + "\n" + decideCore + `
redis.register_function('` + fn + `', function(keys, args) return run(keys, args) end)
`
}

// script is the decision code in both forms: as a script (decideLua and
// its SHA1, for EVALSHA) and as a Function library (its source, and the
// library's and the function's names, for FUNCTION LOAD and FCALL). The
// names carry a digest of the code, so releases whose code differs load
// libraries of their own side by side and never replace each other's.
type script struct {
	src, sha    string
	library, fn string
}

// decisionScript returns the decision code.
func decisionScript() script {
	sum := sha1.Sum([]byte(decideLua))
	sha := hex.EncodeToString(sum[:])
	core := sha1.Sum([]byte(decideCore))
	name := "petstore_ratelimit_" + hex.EncodeToString(core[:8])
	return script{src: decideLua, sha: sha, library: decideLibrary(name, name+"_decide"), fn: name + "_decide"}
}
