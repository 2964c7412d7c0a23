// Package ratelimit enforces sliding-window request quotas and temporary
// bans shared by any number of processes through Redis.
//
// It knows nothing of HTTP: callers ask for a Decision for a key under a
// Policy and map it to whatever their protocol needs.
package ratelimit
