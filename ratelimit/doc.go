// Package ratelimit enforces sliding-window request quotas and temporary
// bans shared by any number of processes through Redis, and throttles
// client addresses with GCRA.
//
// It knows nothing of HTTP: callers ask for a Decision for a key under a
// Policy and map it to whatever their protocol needs. Decisions are made
// by one Lua script on the Redis server, with the server's clock; without
// Redis, or while it is unreachable in fail-open mode, they are made in
// process. See README.md for the promises, the records and the modes,
// and BENCHMARKS.md for the figures.
package ratelimit
