package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// replicaColumns are each replica's series, by their CSV column (after
// the replica's name), in order, and how each is judged.
//
// Heap in use saws between what the last collection left live and the
// goal at which the next starts (twice as much at GOGC=100): a median
// of samples taken at random points of the saw moves by 10% or more
// between two intervals of the same process. It is drawn; the goal,
// which moves only when the live heap does, is judged. Resident memory
// is judged across the run only: after a start it rises for minutes
// with the heap's peaks (the runtime returns pages slowly), so within a
// process's first interval it grows without a leak; a leak shows in the
// heap goal first.
//
// Each connection HAProxy (or the sampler) holds open to a replica costs
// it a goroutine and a descriptor, each request in flight another
// goroutine (net/http's background read), and each of its Redis client's
// pooled connections a descriptor; how many there are follows the load's
// concurrency (the pool keeps as many as were ever in use at once), not
// a leak. The raw counts are drawn, and goroutines and descriptors are
// judged net of those: what is left (listeners, files, timers, the
// limiter's workers; a socket the replica never closed) is the
// replica's own. Goroutines are told apart in one goroutine profile, by
// their stacks: a count of goroutines less one of connections taken a
// moment apart moved by up to seven between samples, as HAProxy opened
// and closed connections meanwhile.
var replicaColumns = []struct {
	name   string
	metric string // the /metrics sample it comes from, if any
	rule   rule
}{
	{"rss_bytes", "process_resident_memory_bytes", rule{across: true, floor: rssFloor}},
	{"heap_inuse_bytes", "go_memstats_heap_inuse_bytes", rule{}},
	{"heap_goal_bytes", "go_memstats_next_gc_bytes", rule{across: true, within: true, floor: heapGoalFloor}},
	{"goroutines", "go_goroutines", rule{}},
	{"in_flight", "petstore_http_requests_in_flight", rule{}},
	{"open_fds", "", rule{}},    // /proc/PID/fd
	{"conns", "", rule{}},       // accepted, established (census)
	{"redis_conns", "", rule{}}, // to Redis, established (census)
	{goroutinesOwn, "", rule{across: true, within: true}},
	{openFDsOwn, "", rule{across: true, within: true}},
}

// heapGoalFloor is the least rise of a replica's heap goal that fails: at
// about 31 MiB, fresh replicas at the same load in the first and the last
// steady interval differed by 0.3 to 1.6 MiB in the five-minute form and
// by 0.3 to 1.3 MiB in the hour's (1-5%, a step after the first fault,
// level from there on), and single samples by up to 3 MiB. The step was
// mostly the Redis client's pool, which a restart's burst grows by a few
// connections kept idle for 30 minutes; at 256 KiB of buffers each it was
// up to 1.8 MiB, at 64 KiB (internal/config's pipelineBuffer) 0.4 MiB.
// 5% of such a heap is 1.55 MiB; a leak passes 2 MiB within the hour.
const heapGoalFloor = 2 << 20

// rssFloor is the least rise of a replica's resident memory that fails.
// The first steady interval's replicas are still climbing (59 to 62 MiB
// over its two minutes in the five-minute form); the last interval's
// start near the top of that climb and come down, for a fault's burst (a
// roll puts a third of the load on the others, a Redis restart piles
// requests up) raised their heaps and the runtime returns freed pages
// only slowly, keeping about a tenth of the heap goal (3.5 MiB at 35 MiB)
// besides. Across the run, at 3,700 to 4,800 requests/s, resident memory
// rose 0.7 to 3.4 MiB (1% to 6.2%) in eight five-minute runs:
// heapGoalFloor for the heap goal's step and 3 MiB for the pages kept. A
// replica's own leak shows sooner in its heap goal, goroutines and
// descriptors, judged more finely.
const rssFloor = heapGoalFloor + 3<<20

const (
	goroutinesOwn = "goroutines_own" // goroutines serving no connection (ownGoroutines)
	openFDsOwn    = "open_fds_own"   // open_fds - conns - redis_conns
)

// The series read from Redis: INFO's used_memory, and DBSIZE. Each
// fault restarts Redis empty, so a record that never expires shows only
// within an interval: both are judged there too, in intervals of at
// least redisSettles. After a start the records climb for a minute and a
// half before the first of them expire (20,008 keys to 26,384 and back
// to 25,242, in the 5-minute form on 763c587): the five-minute form's
// intervals, under two minutes, would see that climb; the hour's, of
// seven and a half, see the records settled in their second half.
const (
	redisSettles = 4 * time.Minute

	redisMemory = "redis_used_memory_bytes"
	redisKeys   = "redis_keys"
	// redisFull is how many of 500 random keys are window records grown
	// into full rings (ratelimit/format.go's version 1). With compact
	// records, Redis's memory follows it: drawn, not judged.
	redisFull = "redis_full_records_of_500"
)

// fullScript counts redisFull's sample in one call.
const fullScript = `local f = 0
for _ = 1, 500 do
  local k = redis.call('RANDOMKEY')
  if k and string.find(k, '}:w:', 1, true) and redis.call('GETRANGE', k, 0, 0) == '\1' then f = f + 1 end
end
return f`

// seriesNames returns every series' name, in the CSV's order, and the
// rules of those judged.
func seriesNames(replicas int) ([]string, map[string]rule) {
	var all []string
	rules := map[string]rule{}
	for i := 1; i <= replicas; i++ {
		for _, c := range replicaColumns {
			name := fmt.Sprintf("r%d_%s", i, c.name)
			all = append(all, name)
			if c.rule != (rule{}) {
				rules[name] = c.rule
			}
		}
	}
	for _, name := range []string{redisMemory, redisKeys} {
		all = append(all, name)
		rules[name] = rule{across: true, within: true, withinFrom: redisSettles}
	}
	return append(all, redisFull), rules
}

// replicaTarget is where the sampler reads one replica: its metrics, its
// process (0: none running now) and the ports it accepts on.
type replicaTarget struct {
	opsURL   string
	pid      int
	api, ops int
}

// readSeries reads every series now. A replica or Redis that does not
// answer (one being restarted) leaves its series out; the errors say
// which.
func readSeries(ctx context.Context, client *http.Client, replicas []replicaTarget, redisPort int) (map[string]float64, []error) {
	out := map[string]float64{}
	var errs []error
	for i, r := range replicas {
		name := func(column string) string { return fmt.Sprintf("r%d_%s", i+1, column) }
		before, beforeErr := census(r.pid, []int{r.api, r.ops}, redisPort)
		censused := beforeErr == nil
		m, err := scrape(ctx, client, r.opsURL)
		if err != nil {
			errs = append(errs, fmt.Errorf("r%d: %w", i+1, err))
			continue
		}
		for _, c := range replicaColumns {
			if c.metric == "" {
				continue
			}
			if v, ok := m[c.metric]; ok {
				out[name(c.name)] = v
			} else {
				errs = append(errs, fmt.Errorf("r%d: no %s in /metrics", i+1, c.metric))
			}
		}
		// Connections come and go between the scrape and the census: the
		// mean of one before and one after stands for the moment of the
		// scrape. (The scrape's own connection is open in both, and idle,
		// as between samples.)
		after, err := census(r.pid, []int{r.api, r.ops}, redisPort)
		if err != nil || !censused {
			errs = append(errs, fmt.Errorf("r%d: %w", i+1, cmp.Or(err, beforeErr)))
			continue
		}
		mean := func(f func(fdCensus) int) float64 { return float64(f(before)+f(after)) / 2 }
		conns := mean(func(c fdCensus) int { return c.accepted })
		out[name("open_fds")] = mean(func(c fdCensus) int { return c.total })
		out[name("conns")] = conns
		out[name("redis_conns")] = mean(func(c fdCensus) int { return c.redis })
		out[name(openFDsOwn)] = mean(func(c fdCensus) int { return c.total - c.accepted - c.redis })
		if n, err := ownGoroutines(ctx, client, r.opsURL); err != nil {
			errs = append(errs, fmt.Errorf("r%d: %w", i+1, err))
		} else {
			out[name(goroutinesOwn)] = float64(n)
		}
	}
	redisAddr := fmt.Sprintf("127.0.0.1:%d", redisPort)
	info, err := redisDo(redisAddr, "INFO", "memory")
	if err == nil {
		var v float64
		if v, err = infoField(info, "used_memory"); err == nil {
			out[redisMemory] = v
		}
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("redis: %w", err))
	}
	if n, err := redisDo(redisAddr, "DBSIZE"); err != nil {
		errs = append(errs, fmt.Errorf("redis: %w", err))
	} else if v, err := strconv.ParseFloat(n, 64); err == nil {
		out[redisKeys] = v
	}
	if n, err := redisDo(redisAddr, "EVAL", fullScript, "0"); err != nil {
		errs = append(errs, fmt.Errorf("redis: %w", err))
	} else if v, err := strconv.ParseFloat(n, 64); err == nil {
		out[redisFull] = v
	}
	return out, errs
}

// fdCensus is a process's descriptors at one moment, and how many of
// them are established TCP connections it accepted, or opened to Redis.
type fdCensus struct {
	total, accepted, redis int
}

// census takes process pid's fdCensus from /proc: its descriptors, and
// for each socket among them its connection in /proc/net/tcp.
// Connections accepted on one of ports count as accepted, connections to
// redisPort as Redis's; only ESTABLISHED ones: a socket its peer has
// closed (CLOSE_WAIT) stays the process's own until it closes it too.
func census(pid int, ports []int, redisPort int) (fdCensus, error) {
	var c fdCensus
	if pid == 0 {
		return c, errors.New("not running")
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return c, err
	}
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return c, err
	}
	conns := parseProcNetTCP(table)
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		c.total++
		inode, ok := strings.CutPrefix(link, "socket:[")
		if !ok {
			continue
		}
		tc, ok := conns[strings.TrimSuffix(inode, "]")]
		if !ok || tc.state != tcpEstablished {
			continue
		}
		switch {
		case slices.Contains(ports, tc.local):
			c.accepted++
		case tc.remote == redisPort:
			c.redis++
		}
	}
	return c, nil
}

// tcpConn is one connection of /proc/net/tcp: its ports and state.
type tcpConn struct {
	local, remote int
	state         string
}

const tcpEstablished = "01"

// parseProcNetTCP returns /proc/net/tcp's connections by socket inode.
func parseProcNetTCP(b []byte) map[string]tcpConn {
	out := map[string]tcpConn{}
	for line := range strings.SplitSeq(string(b), "\n") {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid
		// timeout inode ...; addresses are hex IP:port.
		f := strings.Fields(line)
		if len(f) < 10 || f[9] == "0" {
			continue
		}
		local, err1 := hexPort(f[1])
		remote, err2 := hexPort(f[2])
		if err1 != nil || err2 != nil {
			continue // the header
		}
		out[f[9]] = tcpConn{local: local, remote: remote, state: f[3]}
	}
	return out
}

func hexPort(addr string) (int, error) {
	_, h, ok := strings.Cut(addr, ":")
	if !ok {
		return 0, fmt.Errorf("no port in %q", addr)
	}
	p, err := strconv.ParseUint(h, 16, 16)
	return int(p), err
}

// scrape returns the unlabelled samples of the /metrics at opsURL.
func scrape(ctx context.Context, client *http.Client, opsURL string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, opsURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// ownGoroutines reads a replica's goroutines from its profile
// (/debug/pprof/goroutine, the ops port's) and counts those that serve no
// connection (connGoroutines).
func ownGoroutines(ctx context.Context, client *http.Client, opsURL string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, opsURL+"/debug/pprof/goroutine?debug=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /debug/pprof/goroutine: %s (the replica runs without --pprof?)", resp.Status)
	}
	total, conn, err := connGoroutines(resp.Body)
	return total - conn, err
}

// connFrames are the functions a goroutine that serves a connection runs
// under: net/http's per connection (the handler of a request in flight
// runs on it) and its read behind a request in flight.
var connFrames = []string{"net/http.(*conn).serve", "net/http.(*connReader).backgroundRead"}

// connGoroutines reads a goroutine profile in its text form (debug=1: a
// count per distinct stack, then the stack's frames, one "#" line each)
// and returns how many goroutines it holds, and how many of them run
// under a connFrames function: one snapshot, so that no connection
// opened or closed between two readings counts on one side only.
func connGoroutines(r io.Reader) (total, conn int, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	n, counted, seen := 0, false, false
	for sc.Scan() {
		line := sc.Text()
		if count, _, ok := strings.Cut(line, " @ "); ok {
			if n, err = strconv.Atoi(count); err != nil {
				return 0, 0, fmt.Errorf("goroutine profile: %q", line)
			}
			total += n
			counted, seen = false, true
			continue
		}
		f := strings.Fields(line)
		if counted || len(f) < 3 || f[0] != "#" {
			continue
		}
		for _, fn := range connFrames {
			if strings.HasPrefix(f[2], fn+"+") {
				conn += n
				counted = true
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if !seen {
		return 0, 0, errors.New("goroutine profile: no stacks")
	}
	return total, conn, nil
}

// parseMetrics reads Prometheus' text format, keeping the samples
// without labels.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// infoField returns a numeric field of Redis's INFO reply.
func infoField(info, field string) (float64, error) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("INFO has no %s", field)
}

// redisDo sends one command to the Redis at addr on a connection of its
// own and returns the reply: a simple string, an integer or a bulk
// string. The soak asks once every few seconds; a pool would earn
// nothing.
func redisDo(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s: %s", args[0], line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("%s: bulk reply %q", args[0], line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("%s: unexpected reply %q", args[0], line)
}

// csvLog writes one row a sample to the run's CSV, flushed at once so
// that a run cut short keeps what it saw.
type csvLog struct {
	f      *os.File
	w      *csv.Writer
	series []string
	start  time.Time
}

func newCSVLog(path string, series []string, start time.Time) (*csvLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	l := &csvLog{f: f, w: csv.NewWriter(f), series: series, start: start}
	header := append([]string{"time", "elapsed_s", "phase", "requests_per_s", "failed", "dropped"}, series...)
	if err := l.w.Write(header); err != nil {
		f.Close()
		return nil, err
	}
	l.w.Flush()
	return l, l.w.Error()
}

// write appends s.
func (l *csvLog) write(s sample) error {
	row := []string{
		s.at.UTC().Format(time.RFC3339Nano),
		strconv.FormatFloat(s.at.Sub(l.start).Seconds(), 'f', 1, 64),
		string(s.phase),
		strconv.FormatFloat(s.rps, 'f', 1, 64),
		strconv.FormatInt(s.failed, 10),
		strconv.FormatInt(s.dropped, 10),
	}
	for _, name := range l.series {
		v, ok := s.values[name]
		if !ok {
			row = append(row, "")
			continue
		}
		row = append(row, strconv.FormatFloat(v, 'f', -1, 64))
	}
	if err := l.w.Write(row); err != nil {
		return err
	}
	l.w.Flush()
	return l.w.Error()
}

func (l *csvLog) Close() error { return l.f.Close() }
