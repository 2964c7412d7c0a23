package apikey

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/animal-store/petstore/internal/plan"
	"github.com/animal-store/petstore/internal/yamlerr"
	"github.com/animal-store/petstore/ratelimit"
)

// StaticKeys is an immutable set of keys read from a keys file, by hash.
// A nil *StaticKeys holds no keys.
type StaticKeys struct {
	byHash  map[string]Record
	records []Record
}

// LoadKeys reads the keys file at path (see ParseKeys), checking it against
// plans. An empty path means no file and no static keys.
func LoadKeys(path string, plans *plan.Set) (*StaticKeys, error) {
	if path == "" {
		return &StaticKeys{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	k, err := ParseKeys(data, plans)
	if err != nil {
		return nil, fmt.Errorf("keys file %s: %w", path, err)
	}
	return k, nil
}

// ParseKeys decodes a keys file, checking every key against plans.
//
// The file is YAML with one key, keys, listing entries:
//
//	keys:
//	  - key: pst_...             # the key itself, for development and tests
//	    plan: free
//	    label: local development
//	  - sha256: 5f0c...          # or its lowercase hex SHA-256, for production
//	    plan: Enterprise
//	    label: acme
//	    quotas: [{limit: 5000, period: 1m}, {limit: 2000000, period: 24h}]
//	  - sha256: 77aa...
//	    plan: pro
//	    label: globex
//	    candidate: {quotas: [{limit: 100, period: 1m}]}
//	  - sha256: 9b1d...
//	    plan: pro
//	    revoked: true
//
// Each entry has exactly one of key (a well-formed key: it is hashed at
// load and the plaintext is not kept) or sha256 (64 hex characters, any
// case), and:
//
//   - plan (required): a plan of the plans set, in any case;
//   - label (optional): who the key belongs to;
//   - quotas (optional): list of {limit, period} as in the plans file, each
//     replacing the plan's quota of the same period or adding one; required
//     on a per-key plan such as enterprise;
//   - candidate (optional): {quotas: [...]}, proposed quotas measured on
//     the key's traffic beside the enforced ones and never refusing a
//     request (see the plans file's candidate). Each replaces the plan's
//     candidate quota of the same period or adds one, as quotas do for the
//     enforced ones, so a key can have a candidate when its plan has none.
//     Left out, the key has its plan's candidate, if any;
//   - revoked (optional): true to refuse the key (401) from now on.
//
// Decoding is strict: unknown fields, wrong types, an unknown plan, a
// malformed key, both or neither of key and sha256, bad quotas (a limit
// out of range, a bad period, two quotas of one list with one period), a
// candidate without quotas and the same key listed twice are errors
// naming the entry by its index and the field (keys[2].candidate.quotas[0].limit)
// with its line. Errors never quote a key. An empty file holds no keys.
func ParseKeys(data []byte, plans *plan.Set) (*StaticKeys, error) {
	var f keysFile
	if err := yamlerr.DecodeStrict(data, &f, "keys file"); errors.Is(err, yamlerr.ErrEmpty) {
		return &StaticKeys{}, nil
	} else if err != nil {
		return nil, locate(data, err)
	}
	k := &StaticKeys{byHash: make(map[string]Record, len(f.Keys)), records: make([]Record, 0, len(f.Keys))}
	index := make(map[string]int, len(f.Keys))
	var lines *yamlerr.Lines // read on the first error
	var errs []string
	fail := func(path, msg string) {
		if lines == nil {
			var root yaml.Node
			_ = yaml.Unmarshal(data, &root) // it decoded before
			lines = yamlerr.Index(&root)
		}
		if line, ok := lines.Line(path); ok {
			path = fmt.Sprintf("%s (line %d)", path, line)
		}
		errs = append(errs, path+": "+msg)
	}
	for i, e := range f.Keys {
		at := fmt.Sprintf("keys[%d]", i)
		rec, field, err := e.record(plans)
		if err != nil {
			if field != "" {
				at += "." + field
			}
			fail(at, err.Error())
			continue
		}
		if j, dup := index[rec.Hash]; dup {
			fail(at, fmt.Sprintf("the same key as keys[%d]", j))
			continue
		}
		index[rec.Hash] = i
		k.byHash[rec.Hash] = rec
		k.records = append(k.records, rec)
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	return k, nil
}

// Lookup returns the key whose hash is hash.
func (k *StaticKeys) Lookup(hash string) (Record, bool) {
	if k == nil {
		return Record{}, false
	}
	r, ok := k.byHash[hash]
	return cloneRecord(r), ok
}

// Records returns the keys in file order.
func (k *StaticKeys) Records() []Record {
	if k == nil {
		return nil
	}
	out := make([]Record, len(k.records))
	for i, r := range k.records {
		out[i] = cloneRecord(r)
	}
	return out
}

// Len returns the number of keys.
func (k *StaticKeys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.records)
}

func cloneRecord(r Record) Record {
	r.Overrides = append([]ratelimit.Window(nil), r.Overrides...)
	r.Candidate = slices.Clone(r.Candidate)
	if r.RevokedAt != nil {
		t := *r.RevokedAt
		r.RevokedAt = &t
	}
	return r
}

type keysFile struct {
	Keys []keySpec `yaml:"keys"`
}

type keySpec struct {
	Key       string         `yaml:"key"`
	SHA256    string         `yaml:"sha256"`
	Plan      string         `yaml:"plan"`
	Label     string         `yaml:"label"`
	Quotas    []plan.Quota   `yaml:"quotas"`
	Candidate *candidateSpec `yaml:"candidate"`
	Revoked   bool           `yaml:"revoked"`
}

// candidateSpec is a key's candidate: quotas measured on the key's
// traffic beside its enforced ones, never refusing a request.
type candidateSpec struct {
	Quotas []plan.Quota `yaml:"quotas"`
}

// record checks the entry against plans; on error, field names the field
// at fault within the entry ("" for the entry as a whole).
func (e keySpec) record(plans *plan.Set) (rec Record, field string, err error) {
	var hash string
	switch {
	case e.Key != "" && e.SHA256 != "":
		return Record{}, "", errors.New("give either key or sha256, not both")
	case e.Key != "":
		if err := CheckFormat(e.Key); err != nil {
			return Record{}, "key", err
		}
		hash = Hash(e.Key)
	case e.SHA256 != "":
		hash = strings.ToLower(e.SHA256)
		if !validHash(hash) {
			return Record{}, "sha256", errors.New("want the 64 hex characters of a SHA-256")
		}
	default:
		return Record{}, "", errors.New("give key or sha256")
	}
	if e.Plan == "" {
		return Record{}, "plan", errors.New("required")
	}
	overrides, field, err := windows(e.Quotas, "quotas")
	if err != nil {
		return Record{}, field, err
	}
	var candidate []ratelimit.Window
	if e.Candidate != nil {
		if len(e.Candidate.Quotas) == 0 {
			return Record{}, "candidate.quotas", errors.New("a candidate needs at least one quota (leave candidate out to drop it)")
		}
		if candidate, field, err = windows(e.Candidate.Quotas, "candidate.quotas"); err != nil {
			return Record{}, field, err
		}
	}
	rec = Record{
		ID:        IDFromHash(hash),
		Hash:      hash,
		Label:     e.Label,
		Plan:      plan.Normalize(e.Plan),
		Overrides: overrides,
		Candidate: candidate,
	}
	if _, err := rec.Policy(plans); errors.Is(err, plan.ErrUnknownPlan) {
		return Record{}, "plan", fmt.Errorf("unknown plan %q (the plans are %s)", e.Plan, strings.Join(plans.Names(), ", "))
	} else if err != nil {
		// Each quota was checked above, so what remains is the plan's
		// demand for quotas of the key's own (a per-key plan).
		return Record{}, "quotas", err
	}
	if e.Revoked {
		// The file does not say when; the zero time stands for "revoked".
		rec.RevokedAt = &time.Time{}
	}
	return rec, "", nil
}

// windows reads the quotas of an entry's list at field (quotas,
// candidate.quotas); on error, it names the quota's field at fault
// (quotas[1].period).
func windows(qs []plan.Quota, field string) ([]ratelimit.Window, string, error) {
	ws := make([]ratelimit.Window, 0, len(qs))
	for i, q := range qs {
		at := fmt.Sprintf("%s[%d]", field, i)
		if q.Limit < 1 || q.Limit > ratelimit.MaxLimit {
			return nil, at + ".limit", fmt.Errorf("must be from 1 to %d, got %d", ratelimit.MaxLimit, q.Limit)
		}
		if q.Period == "" {
			return nil, at + ".period", errors.New("required")
		}
		d, err := plan.ParseQuotaPeriod(q.Period)
		if err != nil {
			return nil, at + ".period", err
		}
		if j := slices.IndexFunc(ws, func(w ratelimit.Window) bool { return w.Period == d }); j >= 0 {
			return nil, at + ".period", fmt.Errorf("%s is also the period of %s[%d]", ratelimit.FormatPeriod(d), field, j)
		}
		ws = append(ws, ratelimit.Window{Limit: int64(q.Limit), Period: d})
	}
	return ws, "", nil
}

// locate rewrites a decoding error so that each problem names the entry it
// is in, in the file's terms, and never repeats a value from the file: a
// misplaced key must not end up in a log.
func locate(data []byte, err error) error {
	if s, ok := yamlerr.ParseSyntax(data, err); ok {
		where := s.Where()
		if path, _, ok := s.Lines.Last(s.Line); ok && strings.HasPrefix(path, "keys[") {
			where = fmt.Sprintf("%s (%s)", path[:strings.IndexByte(path, ']')+1], where)
		}
		msg := s.Message
		if s.Context != "" {
			msg += fmt.Sprintf(" while parsing %s (line %d, column %d)", s.Context, s.ContextLine, s.ContextColumn)
		}
		return fmt.Errorf("%s: not YAML: %s", where, msg)
	}
	root, problems, ok := yamlerr.Problems(data, err)
	if !ok {
		return err
	}
	entries := keyEntries(root)
	msgs := make([]string, 0, len(problems))
	for _, p := range problems {
		if p.Line == 0 {
			msgs = append(msgs, "problem in the file")
			continue
		}
		var msg string
		switch p.Kind {
		case yamlerr.UnknownField:
			msg = fmt.Sprintf("unknown field %q", p.Field)
		case yamlerr.TypeMismatch:
			msg = fmt.Sprintf("want %s, got %s", typeWord(p.Into), strings.TrimPrefix(p.Tag, "!!"))
		case yamlerr.Duplicate:
			msg = fmt.Sprintf("field %q given twice (first at line %s)", p.Field, p.FirstLine)
		default:
			msg = "cannot decode"
		}
		where := fmt.Sprintf("line %d", p.Line)
		for i := len(entries) - 1; i >= 0; i-- {
			if entries[i].Line <= p.Line {
				where = fmt.Sprintf("keys[%d] (line %d)", i, p.Line)
				break
			}
		}
		msgs = append(msgs, where+": "+msg)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// keyEntries returns the nodes of the keys list, if the file has one.
func keyEntries(root *yaml.Node) []*yaml.Node {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil
	}
	m := root.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "keys" && m.Content[i+1].Kind == yaml.SequenceNode {
			return m.Content[i+1].Content
		}
	}
	return nil
}

func typeWord(goType string) string {
	switch {
	case goType == "int64":
		return "a whole number"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	default:
		return "a mapping"
	}
}
