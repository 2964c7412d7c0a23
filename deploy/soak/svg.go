package main

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// chart is one panel of the SVG: a quantity over the run, one line per
// series.
type chart struct {
	title  string
	scale  float64 // values are divided by it (bytes to MiB)
	series []string
}

// charts lays out the panels: each replica series for every replica,
// then Redis, then the load.
func charts(replicas int) []chart {
	var out []chart
	for _, rc := range replicaColumns {
		col := rc.name
		c := chart{title: col, scale: 1}
		if strings.HasSuffix(col, "_bytes") {
			c.title, c.scale = strings.TrimSuffix(col, "_bytes")+" (MiB)", 1<<20
		}
		for i := 1; i <= replicas; i++ {
			c.series = append(c.series, fmt.Sprintf("r%d_%s", i, col))
		}
		out = append(out, c)
	}
	return append(out,
		chart{title: "redis used_memory (MiB)", scale: 1 << 20, series: []string{redisMemory}},
		chart{title: "redis keys", scale: 1, series: []string{redisKeys}},
		chart{title: "full window records of 500 random keys", scale: 1, series: []string{redisFull}},
		chart{title: "requests/s", scale: 1, series: []string{rpsSeries}},
	)
}

// rpsSeries is the load's throughput, drawn with the series.
const rpsSeries = "requests_per_s"

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// SVG geometry: each panel's plot area, and the margins around it.
const (
	plotW, plotH   = 840, 130
	left, right    = 70, 90
	top, panelGap  = 50, 45
	legendFontSize = 11
)

// writeSVG draws every chart over the run's time, the faults' windows
// shaded red and the warm-ups grey, so that growth can be seen against
// what the fleet went through.
func writeSVG(w io.Writer, samples []sample, start, end time.Time, replicas int) error {
	cs := charts(replicas)
	width := left + plotW + right
	height := top + len(cs)*(plotH+panelGap)
	total := end.Sub(start).Seconds()
	if total <= 0 {
		total = 1
	}
	x := func(t time.Time) float64 { return left + plotW*t.Sub(start).Seconds()/total }

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n",
		width, height, width, height, legendFontSize)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(b, `<text x="%d" y="18" font-size="13">petstore soak, %s: warm-up grey, faults red</text>`+"\n",
		left, html.EscapeString(start.UTC().Format(time.RFC3339)))
	for i, c := range cs {
		y0 := float64(top + i*(plotH+panelGap))
		drawPanel(b, c, samples, x, y0, total, start)
	}
	fmt.Fprintln(b, "</svg>")
	return b.Flush()
}

func drawPanel(b *bufio.Writer, c chart, samples []sample, x func(time.Time) float64, y0, total float64, start time.Time) {
	// Phase bands, one rectangle per run of warm-up or fault samples,
	// each reaching back to the sample before it.
	for i := 0; i < len(samples); {
		p := samples[i].phase
		j := i
		for j < len(samples) && samples[j].phase == p {
			j++
		}
		if p != phaseSteady {
			from := start
			if i > 0 {
				from = samples[i-1].at
			}
			fill := "#eeeeee"
			if p == phaseFault {
				fill = "#fadbd8"
			}
			x1, x2 := x(from), x(samples[j-1].at)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s"/>`+"\n", x1, y0, math.Max(x2-x1, 1), plotH, fill)
		}
		i = j
	}

	// From 0, or below it: a count net of connections can dip under 0
	// when connections open between the scrape and the census.
	lo, hi := 0.0, 0.0
	for _, s := range samples {
		for _, name := range c.series {
			if v, ok := value(s, name); ok {
				lo, hi = math.Min(lo, v/c.scale), math.Max(hi, v/c.scale)
			}
		}
	}
	if lo < 0 {
		lo = -niceCeil(-lo)
	}
	hi = niceCeil(hi)
	y := func(v float64) float64 { return y0 + plotH - plotH*(v-lo)/(hi-lo) }

	fmt.Fprintf(b, `<rect x="%d" y="%.1f" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, plotW, plotH)
	fmt.Fprintf(b, `<text x="%d" y="%.1f" font-size="12">%s</text>`+"\n", left, y0-6, html.EscapeString(c.title))
	for k := 0; k <= 4; k++ {
		v := lo + (hi-lo)*float64(k)/4
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+plotW, y(v), y(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-4, y(v)+4, tick(v))
	}
	step := tickStep(total)
	for s := 0.0; s <= total+1e-9; s += step {
		xs := left + plotW*s/total
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#999"/>`+"\n", xs, xs, y0+plotH, y0+plotH+4)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xs, y0+plotH+15, clock(time.Duration(s*float64(time.Second))))
	}

	for k, name := range c.series {
		color := palette[k%len(palette)]
		// A missing reading (a replica being restarted) breaks the line.
		var pts []string
		flush := func() {
			if len(pts) > 1 {
				fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.3" points="%s"/>`+"\n", color, strings.Join(pts, " "))
			} else if len(pts) == 1 {
				xy := strings.Split(pts[0], ",")
				fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="1.5" fill="%s"/>`+"\n", xy[0], xy[1], color)
			}
			pts = pts[:0]
		}
		for _, s := range samples {
			v, ok := value(s, name)
			if !ok {
				flush()
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), y(v/c.scale)))
		}
		flush()
		if len(c.series) == 1 {
			continue // the title names it
		}
		label := name[:strings.IndexByte(name, '_')] // r1
		ly := y0 + 12 + float64(k)*14
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n", left+plotW+8, left+plotW+22, ly-4, ly-4, color)
		fmt.Fprintf(b, `<text x="%d" y="%.1f">%s</text>`+"\n", left+plotW+26, ly, html.EscapeString(label))
	}
}

// value returns series name of s; the load's throughput is one too.
func value(s sample, name string) (float64, bool) {
	if name == rpsSeries {
		return s.rps, true
	}
	v, ok := s.values[name]
	return v, ok
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, so that the
// axis's quarters are round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 4, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// tickStep is the time between the x axis's ticks, in seconds: about
// ten ticks over the run.
func tickStep(total float64) float64 {
	for _, s := range []float64{10, 30, 60, 120, 300, 600, 900, 1800, 3600} {
		if total/s <= 12 {
			return s
		}
	}
	return 7200
}

func tick(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}
