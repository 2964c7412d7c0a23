// Package ratelimit enforces sliding-window request quotas and temporary bans
// shared by any number of processes through Redis, and throttles client
// addresses with GCRA. It knows nothing of HTTP: callers ask for a Decision for
// a key under a Policy. Decisions are made by a Lua script on the Redis server,
// by its clock; without Redis, or while it is unreachable in fail-open mode, in
// process. README.md states the promises.
package ratelimit
