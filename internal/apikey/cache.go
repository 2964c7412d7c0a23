package apikey

import (
	"container/list"
	"sync/atomic"
	"time"
)

// entry is a database answer for one hash: a key, or none (found false).
// Only resolved changes once the entry is published.
type entry struct {
	hash    string
	rec     Record
	found   bool
	expires time.Time
	// resolved memoizes the principal under the latest plans seen, so that
	// a cached key costs no policy computation per request.
	resolved atomic.Pointer[resolution]
}

// lru holds at most size entries, dropping the least recently used. It is
// not safe for concurrent use: the Authenticator guards it.
type lru struct {
	size  int
	order *list.List // of *entry, most recently used first
	items map[string]*list.Element
}

func newLRU(size int) *lru {
	return &lru{size: size, order: list.New(), items: make(map[string]*list.Element)}
}

// get returns the live entry for hash, or nil; an expired entry is dropped.
func (c *lru) get(hash string, now time.Time) *entry {
	el, ok := c.items[hash]
	if !ok {
		return nil
	}
	e := el.Value.(*entry)
	if !now.Before(e.expires) {
		c.order.Remove(el)
		delete(c.items, hash)
		return nil
	}
	c.order.MoveToFront(el)
	return e
}

// add stores e, replacing any entry for its hash.
func (c *lru) add(e *entry) {
	if el, ok := c.items[e.hash]; ok {
		el.Value = e
		c.order.MoveToFront(el)
		return
	}
	c.items[e.hash] = c.order.PushFront(e)
	for c.order.Len() > c.size {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(*entry).hash)
	}
}

func (c *lru) len() int { return c.order.Len() }
