package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/ratelimit"
)

// flag.Value implementations for the kinds of settings the binary has.

type stringValue struct{ p *string }

func (v stringValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}
func (v stringValue) Set(s string) error { *v.p = s; return nil }

type boolValue struct{ p *bool }

func (v boolValue) String() string {
	if v.p == nil {
		return "false"
	}
	return strconv.FormatBool(*v.p)
}

func (v boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q: must be true or false", s)
	}
	*v.p = b
	return nil
}

// IsBoolFlag lets the flag be given alone: --migrate.
func (v boolValue) IsBoolFlag() bool { return true }

type choiceValue struct {
	p       *string
	choices []string
}

func (v choiceValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v choiceValue) Set(s string) error {
	s = strings.ToLower(strings.TrimSpace(s))
	if !slices.Contains(v.choices, s) {
		return fmt.Errorf("%q: must be one of %s", s, strings.Join(v.choices, ", "))
	}
	*v.p = s
	return nil
}

type intValue struct {
	p   *int
	min int
	max int // 0: none
}

func (v intValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q: not an integer", s)
	}
	if n < v.min {
		return fmt.Errorf("%d: must be at least %d", n, v.min)
	}
	if v.max > 0 && n > v.max {
		return fmt.Errorf("%d: must be at most %d", n, v.max)
	}
	*v.p = n
	return nil
}

type int64Value struct {
	p   *int64
	min int64
}

func (v int64Value) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatInt(*v.p, 10)
}

func (v int64Value) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("%q: not an integer", s)
	}
	if n < v.min {
		return fmt.Errorf("%d: must be at least %d", n, v.min)
	}
	*v.p = n
	return nil
}

type durationValue struct {
	p   *time.Duration
	min time.Duration
	max time.Duration // 0: no upper bound
}

func (v durationValue) String() string {
	if v.p == nil {
		return ""
	}
	return v.p.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q: not a duration (e.g. 500ms, 5s, 1m)", s)
	}
	if d < v.min {
		return fmt.Errorf("%s: must be at least %s", d, v.min)
	}
	if v.max > 0 && d > v.max {
		return fmt.Errorf("%s: must be at most %s", d, v.max)
	}
	*v.p = d
	return nil
}

type listValue struct{ p *[]string }

func (v listValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v listValue) Set(s string) error {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	*v.p = out
	return nil
}

type prefixListValue struct{ p *[]netip.Prefix }

func (v prefixListValue) String() string {
	if v.p == nil {
		return ""
	}
	parts := make([]string, len(*v.p))
	for i, p := range *v.p {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}

func (v prefixListValue) Set(s string) error {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			// A bare address trusts exactly that host.
			a, err := netip.ParseAddr(f)
			if err != nil {
				return fmt.Errorf("%q: not a CIDR or IP address", f)
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("%q: not a CIDR", f)
		}
		out = append(out, p.Masked())
	}
	*v.p = out
	return nil
}

type windowValue struct{ p *ratelimit.Window }

func (v windowValue) String() string {
	if v.p == nil || v.p.Limit == 0 {
		return ""
	}
	return v.p.String()
}

func (v windowValue) Set(s string) error {
	w, err := plan.ParseQuota(s)
	if err != nil {
		return err
	}
	*v.p = w
	return nil
}
