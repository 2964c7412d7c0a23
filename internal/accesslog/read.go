package accesslog

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sort"
	"sync"
)

// Input is one log to read: a file, or standard input.
type Input struct {
	// Name says where the log comes from, in errors and reports.
	Name string
	// Open returns the log's bytes, plain or gzip-compressed (told by the
	// gzip magic bytes, not the name). Read closes what it opens.
	Open func() (io.ReadCloser, error)
}

// Counts are the lines read, by kind.
type Counts struct {
	// Lines is every line but blank ones.
	Lines      int64 `json:"lines"`
	Replayable int64 `json:"replayable"`
	NotAsked   int64 `json:"not_asked"`
	Other      int64 `json:"other"`
	Malformed  int64 `json:"malformed"`
}

func (c *Counts) add(o Counts) {
	c.Lines += o.Lines
	c.Replayable += o.Replayable
	c.NotAsked += o.NotAsked
	c.Other += o.Other
	c.Malformed += o.Malformed
}

func (c *Counts) count(k Kind) {
	switch k {
	case Blank:
		return
	case Replayable:
		c.Replayable++
	case NotAsked:
		c.NotAsked++
	case Other:
		c.Other++
	case Malformed:
		c.Malformed++
	}
	c.Lines++
}

// Request is one replayable request of a Log.
type Request struct {
	// At is when it reached the limiter (µs since the Unix epoch).
	At int64
	// Plan is the index of its plan in Log.Plans.
	Plan uint32
	// Outcome is what the limiter decided then: a ratelimit.Outcome.
	Outcome uint8
	// Shadow is true when that decision was not enforced.
	Shadow bool
}

// Log is the replayable requests of one or more access logs, by key: all
// of a key's requests from every input, in time order (ties in a fixed
// order), since a key's decisions depend on its own requests alone.
type Log struct {
	// Keys are the key ids, in order.
	Keys []string
	// Plans are the plan names the lines carry, in order.
	Plans []string
	// Requests holds the requests of Keys[i] at [Start[i], Start[i+1]).
	Requests []Request
	Start    []int
	// Inputs counts the lines of each input, in the order given.
	Inputs []Counts
	// Total counts the lines of all inputs.
	Total Counts
	// From and To are the earliest and latest request (µs), when any.
	From, To int64
}

// KeyRequests returns the requests of key i, in time order.
func (l *Log) KeyRequests(i int) []Request { return l.Requests[l.Start[i]:l.Start[i+1]] }

// sizes are the reader's buffer sizes.
type sizes struct {
	// chunk is how much of a log a worker parses at once.
	chunk int
	// maxLine bounds a line: a longer one is counted malformed and skipped.
	maxLine int
}

// chunk is whole lines of one input.
type chunk struct {
	input int
	buf   []byte
	// overlong counts lines over the longest dropped just before buf.
	overlong int64
}

// Read reads every input and returns their replayable requests, by key,
// in time order. Inputs are read concurrently and parsed by workers (0:
// one per CPU); a line that cannot be used is counted, never an error.
// The error is about an input that cannot be opened or read (a truncated
// gzip stream, say), and names it.
func Read(ctx context.Context, inputs []Input, workers int) (*Log, error) {
	// Chunks large enough that a worker rarely waits for the next, and
	// room for any line the service writes.
	return read(ctx, inputs, workers, sizes{chunk: 1 << 20, maxLine: 64 << 20})
}

func read(ctx context.Context, inputs []Input, workers int, sz sizes) (*Log, error) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Open them all first: a missing file fails at once, before standard
	// input is waited for.
	opened := make([]io.ReadCloser, len(inputs))
	for i, in := range inputs {
		rc, err := in.Open()
		if err != nil {
			for _, o := range opened[:i] {
				o.Close()
			}
			return nil, fmt.Errorf("access log %s: %w", in.Name, err)
		}
		opened[i] = rc
	}

	pool := sync.Pool{New: func() any { b := make([]byte, 0, sz.chunk); return &b }}
	chunks := make(chan chunk, 2*workers)
	var readers sync.WaitGroup
	for i, in := range inputs {
		readers.Go(func() {
			defer opened[i].Close()
			if err := readInput(ctx, i, in.Name, opened[i], sz.maxLine, &pool, chunks); err != nil {
				cancel(err)
			}
		})
	}
	go func() {
		readers.Wait()
		close(chunks)
	}()

	parts := make([]*part, workers)
	var parsers sync.WaitGroup
	for w := range parts {
		pt := newPart(len(inputs))
		parts[w] = pt
		parsers.Go(func() {
			for c := range chunks {
				pt.parseChunk(c)
				if cap(c.buf) == sz.chunk {
					b := c.buf[:0]
					pool.Put(&b)
				}
			}
		})
	}
	parsers.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return merge(parts, len(inputs), workers), nil
}

// readInput sends the input's lines in chunks of whole lines.
func readInput(ctx context.Context, idx int, name string, rc io.Reader, maxLine int, pool *sync.Pool, out chan<- chunk) error {
	br := bufio.NewReaderSize(rc, 64<<10)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("access log %s: %w", name, err)
		}
		defer zr.Close()
		r = zr
	}
	send := func(c chunk) bool {
		select {
		case out <- c:
			return true
		case <-ctx.Done():
			return false
		}
	}
	buf := (*pool.Get().(*[]byte))[:0]
	var overlong int64
	skipping := false // inside a line over maxLine
	for {
		n, err := fill(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if skipping {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				buf = buf[:0]
			} else {
				buf = buf[:copy(buf, buf[i+1:])]
				skipping = false
			}
		}
		switch {
		case err == io.EOF:
			if len(buf) > 0 || overlong > 0 {
				send(chunk{input: idx, buf: buf, overlong: overlong})
			}
			return nil
		case err != nil:
			return fmt.Errorf("access log %s: %w", name, err)
		}
		// The buffer is full: send its whole lines, keep the rest.
		i := bytes.LastIndexByte(buf, '\n')
		if i < 0 {
			if len(buf) >= maxLine {
				overlong++
				skipping = true
				buf = buf[:0]
				continue
			}
			// A long line: room for more of it, up to maxLine.
			nb := make([]byte, len(buf), min(2*cap(buf), maxLine))
			copy(nb, buf)
			buf = nb
			continue
		}
		next := (*pool.Get().(*[]byte))[:0]
		if rest := buf[i+1:]; len(rest) > cap(next) {
			next = make([]byte, 0, 2*len(rest))
		}
		next = append(next, buf[i+1:]...)
		if !send(chunk{input: idx, buf: buf[:i+1], overlong: overlong}) {
			return nil
		}
		buf, overlong = next, 0
	}
}

// fill reads into buf until it is full or r ends (io.EOF, as is).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// part is what one worker parsed: its requests with keys and plans
// numbered in the order it met them.
type part struct {
	p      parser
	keys   map[string]uint32
	plans  map[string]uint32
	keyIDs []string
	plnIDs []string
	reqs   []partReq
	counts []Counts // by input
	from   int64
	to     int64
}

type partReq struct {
	Request
	key uint32
}

func newPart(inputs int) *part {
	return &part{keys: map[string]uint32{}, plans: map[string]uint32{}, counts: make([]Counts, inputs)}
}

func (pt *part) parseChunk(c chunk) {
	counts := &pt.counts[c.input]
	counts.Lines += c.overlong
	counts.Malformed += c.overlong
	b := c.buf
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k := pt.p.parse(line)
		counts.count(k)
		if k != Replayable {
			continue
		}
		p := &pt.p
		key, ok := pt.keys[string(p.keyID.val)]
		if !ok {
			key = uint32(len(pt.keyIDs))
			s := string(p.keyID.val)
			pt.keys[s] = key
			pt.keyIDs = append(pt.keyIDs, s)
		}
		pl, ok := pt.plans[string(p.plan.val)]
		if !ok {
			pl = uint32(len(pt.plnIDs))
			s := string(p.plan.val)
			pt.plans[s] = pl
			pt.plnIDs = append(pt.plnIDs, s)
		}
		if len(pt.reqs) == 0 {
			pt.from, pt.to = p.at, p.at
		}
		pt.from, pt.to = min(pt.from, p.at), max(pt.to, p.at)
		pt.reqs = append(pt.reqs, partReq{Request: Request{At: p.at, Plan: pl, Outcome: uint8(p.outcome), Shadow: p.shadow}, key: key})
	}
}

// merge numbers keys and plans in order across the workers' parts and
// groups the requests by key, each key's in time order.
func merge(parts []*part, inputs, workers int) *Log {
	l := &Log{Inputs: make([]Counts, inputs)}
	keyIdx := map[string]int{}
	plnIdx := map[string]int{}
	for _, pt := range parts {
		for _, k := range pt.keyIDs {
			keyIdx[k] = 0
		}
		for _, p := range pt.plnIDs {
			plnIdx[p] = 0
		}
		for i, c := range pt.counts {
			l.Inputs[i].add(c)
			l.Total.add(c)
		}
	}
	l.Keys = sortedKeys(keyIdx)
	l.Plans = sortedKeys(plnIdx)
	keyMaps := make([][]uint32, len(parts))
	plnMaps := make([][]uint32, len(parts))
	l.Start = make([]int, len(l.Keys)+1)
	first := true
	for w, pt := range parts {
		keyMaps[w] = make([]uint32, len(pt.keyIDs))
		for i, k := range pt.keyIDs {
			keyMaps[w][i] = uint32(keyIdx[k])
		}
		plnMaps[w] = make([]uint32, len(pt.plnIDs))
		for i, p := range pt.plnIDs {
			plnMaps[w][i] = uint32(plnIdx[p])
		}
		for _, r := range pt.reqs {
			l.Start[keyMaps[w][r.key]+1]++
		}
		if len(pt.reqs) > 0 {
			if first {
				l.From, l.To, first = pt.from, pt.to, false
			}
			l.From, l.To = min(l.From, pt.from), max(l.To, pt.to)
		}
	}
	for i := range l.Keys {
		l.Start[i+1] += l.Start[i]
	}
	l.Requests = make([]Request, l.Start[len(l.Keys)])
	next := slices.Clone(l.Start[:len(l.Keys)])
	for w, pt := range parts {
		for _, r := range pt.reqs {
			k := keyMaps[w][r.key]
			r.Plan = plnMaps[w][r.Plan]
			l.Requests[next[k]] = r.Request
			next[k]++
		}
		pt.reqs = nil
	}
	// Each key's requests in time order; ties in an order of their own,
	// so that the result does not depend on how the workers shared the
	// lines.
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := w; k < len(l.Keys); k += workers {
				rs := l.KeyRequests(k)
				if !slices.IsSortedFunc(rs, compareRequests) {
					slices.SortFunc(rs, compareRequests)
				}
			}
		})
	}
	wg.Wait()
	return l
}

func compareRequests(a, b Request) int {
	switch {
	case a.At != b.At:
		return cmpInt(a.At, b.At)
	case a.Plan != b.Plan:
		return cmpInt(a.Plan, b.Plan)
	case a.Outcome != b.Outcome:
		return cmpInt(a.Outcome, b.Outcome)
	case a.Shadow != b.Shadow:
		if a.Shadow {
			return 1
		}
		return -1
	}
	return 0
}

func cmpInt[T int64 | uint32 | uint8](a, b T) int {
	if a < b {
		return -1
	}
	return 1
}

// sortedKeys numbers m's keys in order, and returns them.
func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	for i, k := range out {
		m[k] = i
	}
	return out
}
