package ratelimit

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// localDecider is the decider in this process: the algorithm of state.go
// over keys held here, at now's reading (no-Redis mode, Simulator, tests).
type localDecider struct {
	store *memStore
	now   func() time.Time
}

func newLocalDecider(now func() time.Time) *localDecider {
	return &localDecider{store: newMemStore(), now: now}
}

func (d *localDecider) decide(_ context.Context, reqs []request, out []verdict) error {
	now := d.now().UnixMicro()
	for i, q := range reqs {
		out[i] = d.at(q, now)
	}
	return nil
}

// one decides a single request without allocating a batch.
func (d *localDecider) one(q request) verdict { return d.at(q, d.now().UnixMicro()) }

// at decides q at now (µs) rather than the decider's clock: the Simulator
// replays a log's times.
func (d *localDecider) at(q request, now int64) verdict {
	return d.store.decide(q.key, q.pl, now, q.in)
}

// memShards spreads keys over separately locked maps, so keys rarely contend.
const memShards = 32

// memStore keeps key states in process: the store when there is no Redis.
type memStore struct {
	seed   maphash.Seed
	shards [memShards]memShard
}

type memShard struct {
	mu   sync.Mutex
	keys map[string]*keyState
}

func newMemStore() *memStore {
	m := &memStore{seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].keys = make(map[string]*keyState)
	}
	return m
}

func (m *memStore) shard(key string) *memShard {
	return &m.shards[maphash.String(m.seed, key)%memShards]
}

// decide evaluates a request for key at now (µs).
func (m *memStore) decide(key string, pl *plan, now int64, in input) verdict {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := sh.keys[key]
	if st == nil {
		st = &keyState{}
		if !in.peek {
			sh.keys[key] = st
		}
	}
	return st.decide(pl, now, in)
}

func (m *memStore) unban(key string) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if st := sh.keys[key]; st != nil {
		st.ban, st.cban = banState{}, banState{}
	}
}

func (m *memStore) forget(key string) {
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.keys, key)
}

func (m *memStore) sweep(now int64) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, st := range sh.keys {
			if st.expires <= now {
				delete(sh.keys, k)
			}
		}
		sh.mu.Unlock()
	}
}
