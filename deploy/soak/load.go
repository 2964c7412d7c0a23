package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// failure is one request answered 5xx, or not answered at all (status
// 0), as the client saw it.
type failure struct {
	send, recv time.Time
	path       string
	status     int
	detail     string // the error, or the start of the body
}

// maxFailures is how many failures a tally keeps for judging; past it,
// it only counts them (and the run fails: so many cannot all be excused).
const maxFailures = 100_000

// tally counts the answers of a stretch of load.
type tally struct {
	status   [600]atomic.Int64 // by status code; 0: no answer
	requests atomic.Int64      // every request that ended, answered or not
	failed   atomic.Int64      // 5xx or no answer
	dropped  atomic.Int64      // arrivals that found every worker busy

	mu       sync.Mutex
	failures []failure
	overflow int64
}

func (t *tally) record(f failure) {
	t.requests.Add(1)
	if f.status >= 0 && f.status < len(t.status) {
		t.status[f.status].Add(1)
	}
	if f.status != 0 && f.status < 500 {
		return
	}
	t.failed.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.failures) < maxFailures {
		t.failures = append(t.failures, f)
	} else {
		t.overflow++
	}
}

// codes returns the count of each status seen (0: no answer).
func (t *tally) codes() map[int]int64 {
	out := map[int]int64{}
	for code := range t.status {
		if n := t.status[code].Load(); n > 0 {
			out[code] = n
		}
	}
	return out
}

// driver sends the soak's requests through HAProxy: GET
// /v1/pets?limit=1, each on a key drawn at random, some keys more often
// than others (keyPicker). Every one goes through authentication, the
// limiter's round trip to Redis and the pet store.
// (GET /v1/rate_limit is left out: it answers 503 whenever its Redis
// read takes longer than --redis-timeout, 50 ms, as it must, and a
// shared 2-core machine has such pauses at any load; the soak would fail
// on the machine, not the service.)
type driver struct {
	url    string
	keys   []string
	pick   keyPicker
	client *http.Client
}

func newDriver(url string, keys []string, workers int) *driver {
	return &driver{
		url:  url,
		keys: keys,
		pick: newKeyPicker(len(keys)),
		client: &http.Client{
			Timeout: 10 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        workers + 16,
				MaxIdleConnsPerHost: workers + 16,
				IdleConnTimeout:     30 * time.Second,
				DisableCompression:  true,
			},
		},
	}
}

// send makes the n-th request and records it in t.
func (d *driver) send(ctx context.Context, n int, t *tally) {
	const path = "/v1/pets?limit=1"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url+path, nil)
	if err != nil {
		panic(err) // the URL was checked when the run started
	}
	req.Header.Set("Authorization", "Bearer "+d.keys[d.pick.key(n)])
	f := failure{send: time.Now(), path: path}
	resp, err := d.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return // the run is ending: not an answer
		}
		f.recv, f.detail = time.Now(), err.Error()
		t.record(f)
		return
	}
	var body []byte
	if resp.StatusCode >= 500 {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 200))
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	f.recv, f.status, f.detail = time.Now(), resp.StatusCode, string(body)
	t.record(f)
}

// capacity sends the soak's requests back to back from workers clients
// for dur after a second's start, and returns how many were answered per
// second: what the fleet serves flat out, on these cores, with this
// client taking its share of them.
func (d *driver) capacity(ctx context.Context, workers int, dur time.Duration, t *tally) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second+dur)
	defer cancel()
	var counted atomic.Int64
	from := time.Now().Add(time.Second)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				d.send(ctx, int(next.Add(1)), t)
				if now := time.Now(); now.After(from) && ctx.Err() == nil {
					counted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); !errors.Is(err, context.DeadlineExceeded) {
		return 0, err
	}
	rate := float64(counted.Load()) / dur.Seconds()
	if rate < 1 {
		return 0, fmt.Errorf("the fleet answered %d requests in %s flat out", counted.Load(), dur)
	}
	return rate, nil
}

// steady sends requests at rate per second until ctx ends, whatever
// their latency (an open model, as real traffic): every millisecond the
// arrivals due are handed to free workers, and one that finds none is
// counted as dropped, not queued.
func (d *driver) steady(ctx context.Context, rate float64, workers int, t *tally) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for n := range jobs {
				d.send(ctx, n, t)
			}
		})
	}
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	n := 0
	for ctx.Err() == nil {
		due := int(time.Since(start).Seconds() * rate)
		for ; n < due; n++ {
			select {
			case jobs <- n:
			default:
				t.dropped.Add(1)
			}
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	close(jobs)
	wg.Wait()
}

// keySpread is the ratio between the busiest key's rate and the quietest's.
const keySpread = 4

// keyPicker draws the key of each request. Keys send at rates spread
// evenly on a log scale over keySpread, each plan's as widely as the
// others'. With compact records a window's record grows into the full
// ring once its key sends in more than compactMaxEntries (24) of a
// minute's 200 buckets, so Redis's memory follows how many keys are past
// that point. Sent in turn, every key sat at one rate, and at about 4,000
// requests/s (24 a minute for each of 10,000 keys) all of them crossed it
// together: memory swung by a tenth between intervals of the same load.
// Spread, a change of rate of 1% moves under 1% of the keys across it.
// The busiest key sends 1.85 times the mean: under the free plan's 60 a
// minute up to about 5,400 requests/s, so that the soak's load is
// answered, not refused, and Redis holds window records, not bans.
type keyPicker struct {
	cum []float64 // cum[i]: the weights of keys 0..i
}

func newKeyPicker(n int) keyPicker {
	p := keyPicker{cum: make([]float64, n)}
	sum := 0.0
	for i := range n {
		// Key i's place on the scale, from the golden ratio's multiples:
		// spread evenly over [0, 1) however the keys are ordered by plan.
		_, u := math.Modf(float64(i+1) * 0.6180339887498949)
		sum += math.Pow(keySpread, u)
		p.cum[i] = sum
	}
	return p
}

// key returns the index of request n's key: the same for the same n.
func (p keyPicker) key(n int) int {
	u := float64(rand.NewPCG(uint64(n), 0).Uint64()>>11) / (1 << 53) // in [0, 1)
	i, _ := slices.BinarySearch(p.cum, u*p.cum[len(p.cum)-1])
	return i
}
