package ratelimit

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
)

// decideCore is the decision code, the Lua files of lua/ as one chunk. It
// decides a batch (one pipeline flush, one Cluster slot) atomically, in order,
// at one reading of the server's clock, as keyState.decide (state.go) does, on
// format.go's records; a batch's decisions for one key see each other's writes.
//
// decide (lua/decide.lua) serves every request, each window's rules written
// once (lua/window.lua). It touches only the bytes it needs (GETRANGE,
// SETRANGE): Redis's Lua hashes every string it makes. No key is ever left
// without a TTL.
//
// KEYS, per decision: the ban record, the window records in plan order, the
// candidate window records, the candidate ban record (if any), the coarse
// records (blocks.go), the other periods' records (registry.go; seeding.nums
// indexes them as if without the coarse records). All in its key's slot.
//
// ARGV[1], per decision, 8-byte big-endian: its KEYS count, its plan (from 1),
// how many numbers follow, then: mode (0 decide, 1 peek, 2 decide and count a
// block), extra strikes, lease want, need and life (µs), which in mode 2 are
// the largest block, 1 and the block's life, followed by the block's ask
// (blockAsk.nums); then, if any, per window the admissions made without Redis
// (input.add) and seeding.nums. A plain decision (mode 0, no strikes, a lease
// of one) sends none.
//
// ARGV[2]: the finalize time (µs, decimal; "0": not in force). ARGV[3p..3p+2]:
// plan p's numbers, ban and candidate ban multipliers. The numbers: window
// count; per window limit, period, bucket width, n, offset unit (µs), TTL (ms);
// the ban rule (banRule.appendNums); the candidate window count and the same
// six per candidate; the candidate ban rule; with blocks, the coarse count and
// per coarse record its window's index, period, width, n, unit and TTL.
//
// Leases: a decision counts want admissions at once when every window has need
// (>= want) left, else one, in every window's current bucket; they may be spent
// until the earliest end of those buckets, at most life after now, recorded as
// the bucket's last event (which only grows). A block (mode 2) counts the
// request in every window and its admissions at its end, in the long windows'
// records and the short ones' coarse records (without coarse records, the long
// windows alone: the old reservation); its size and end come back as a lease's
// (granted: 1 + size).
//
// Reply: a string per decision, in order, of 8-byte big-endian signed integers
// (decode), times in µs. Short form (admitted alone, no candidates: most
// replies): now; with a ban rule, strikes, ban end, offences; per window used
// and reset. Bare: short without the ban fields (no ban rule, or all 0). Whole,
// only what the plan has: outcome, retry, now, granted, lease end; with a ban
// rule, new ban, strikes, ban end, offences; with candidates, their outcome and
// admitted, limited and banned counts, and with a candidate ban rule a new ban,
// strikes, ban end, offences; per window, then per candidate window, used and
// reset. A failed decision is "E" and the error; the others go on.
var decideCore = joinDecisionCode()

// joinDecisionCode joins the decision code's files in their order.
func joinDecisionCode() string {
	return codecLua + ringLua + windowLua + banLua + reserveLua + decideFnLua + runLua
}

// The decision code's files, in order: each uses those before it. codec.lua
// starts every script.
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
	//go:embed lua/run.lua
	runLua string
)

// decideLua is decideCore as a script (EVAL, EVALSHA).
var decideLua = asScript(decideCore)

func asScript(core string) string {
	return core + "\nreturn run(_G.KEYS, _G.ARGV)\n"
}

// decideLibrary returns decideCore as Function library lib registering fn: its
// code runs once, at load, where a script re-creates its helpers every call.
func decideLibrary(lib, fn string) string {
	return "#!lua name=" + lib + "\n" + decideCore + `
redis.register_function('` + fn + `', function(keys, args) return run(keys, args) end)
`
}

// script is the decision code as a script and as a Function library, named by a
// digest of the code: releases whose code differs load their own side by side.
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
