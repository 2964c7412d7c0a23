package yamlerr

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type doc struct {
	Name  string `yaml:"name"`
	Count int    `yaml:"count"`
}

func decode(data string) error {
	dec := yaml.NewDecoder(bytes.NewReader([]byte(data)))
	dec.KnownFields(true)
	var d doc
	return dec.Decode(&d)
}

func TestProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		data string
		want []Problem
	}{
		{"mismatch and unknown field", "name: a\ncount: lots\nextra: 1\n", []Problem{
			{Line: 2, Kind: TypeMismatch, Tag: "!!str", Value: "lots", Into: "int"},
			{Line: 3, Kind: UnknownField, Field: "extra"},
		}},
		{"non-scalar mismatch", "count: [1, 2]\n", []Problem{
			{Line: 1, Kind: TypeMismatch, Tag: "!!seq", Into: "int"},
		}},
		{"duplicate", "name: a\ncount: 1\nname: b\n", []Problem{
			{Line: 3, Kind: Duplicate, Field: "name", FirstLine: "1"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := decode(tt.data)
			root, ps, ok := Problems([]byte(tt.data), err)
			if !ok || root == nil {
				t.Fatalf("not parsed: %v", err)
			}
			if len(ps) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", ps, tt.want)
			}
			for i, p := range ps {
				if p.Message == "" {
					t.Errorf("problem %d lost the decoder's message", i)
				}
				p.Message = ""
				if p != tt.want[i] {
					t.Errorf("problem %d: got %+v, want %+v", i, p, tt.want[i])
				}
			}
		})
	}
}

func TestProblemsOtherErrors(t *testing.T) {
	t.Parallel()
	if _, _, ok := Problems([]byte("a: 1"), errors.New("other")); ok {
		t.Error("a plain error must not parse")
	}
	if _, _, ok := Problems([]byte("a: [1"), &yaml.TypeError{Errors: []string{"x"}}); ok {
		t.Error("unparsable data must not parse")
	}
	_, ps, ok := Problems([]byte("a: 1"), &yaml.TypeError{Errors: []string{"no line here"}})
	if !ok || len(ps) != 1 || ps[0].Line != 0 || ps[0].Kind != Other || ps[0].Message != "no line here" {
		t.Errorf("got %+v %v", ps, ok)
	}
}

func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	for _, empty := range []string{"", "\n\n", "# only a comment\n", "---\n", "null\n"} {
		d := doc{Name: "kept"}
		if err := DecodeStrict([]byte(empty), &d, "test file"); !errors.Is(err, ErrEmpty) || d != (doc{Name: "kept"}) {
			t.Errorf("empty file %q: %v %+v, want ErrEmpty and v untouched", empty, err, d)
		}
	}
	var d doc
	if err := DecodeStrict([]byte("name: a\ncount: 2\n"), &d, "test file"); err != nil || d != (doc{Name: "a", Count: 2}) {
		t.Errorf("one document: %v %+v", err, d)
	}
	err := DecodeStrict([]byte("name: a\n# next\n---\nname: b\n"), &d, "test file")
	var extra *ExtraDocumentError
	if !errors.As(err, &extra) || extra.Line != 3 || extra.Document == nil ||
		err.Error() != "line 3: a second YAML document starts here: a test file holds a single YAML document" {
		t.Errorf("two documents: %v", err)
	}
	if err := DecodeStrict([]byte("name: a\n---\nname: [\n"), &d, "test file"); err == nil || !strings.Contains(err.Error(), "yaml: line") {
		t.Errorf("a second document that is not YAML: %v", err)
	}
	err = DecodeStrict([]byte("nope: 1\n"), &d, "test file")
	if _, ps, ok := Problems([]byte("nope: 1\n"), err); !ok || len(ps) != 1 || ps[0].Kind != UnknownField {
		t.Errorf("unknown field: %v", err)
	}
}

func TestLines(t *testing.T) {
	t.Parallel()
	root := new(yaml.Node)
	data := "plans:\n  free:\n    quotas:\n      - limit: 1\n        period: 1m\n      - {limit: 2, period: 1h}\n  pro: {ban: off}\n"
	if err := yaml.Unmarshal([]byte(data), root); err != nil {
		t.Fatal(err)
	}
	l := Index(root)
	tests := []struct {
		path string
		line int
		ok   bool
	}{
		{"plans", 1, true},
		{"plans.free.quotas", 3, true},
		{"plans.free.quotas[0]", 4, true},
		{"plans.free.quotas[0].period", 5, true},
		{"plans.free.quotas[1].limit", 6, true},
		{"plans.pro.ban", 7, true},
		{"plans.pro.ban.threshold", 7, true}, // left out: its mapping's line
		{"plans.free.quotas[7].limit", 3, true},
		{"plans.gold.x", 1, true},
		{"keys[0]", 0, false},
	}
	for _, tt := range tests {
		if line, ok := l.Line(tt.path); line != tt.line || ok != tt.ok {
			t.Errorf("Line(%q) = %d, %v; want %d, %v", tt.path, line, ok, tt.line, tt.ok)
		}
	}
	for _, tt := range []struct {
		line int
		path string
		at   int
	}{{1, "plans", 1}, {5, "plans.free.quotas[0].period", 5}, {6, "plans.free.quotas[1].period", 6}, {99, "plans.pro.ban", 7}} {
		if path, at, ok := l.Last(tt.line); !ok || path != tt.path || at != tt.at {
			t.Errorf("Last(%d) = %q, %d, %v; want %q, %d", tt.line, path, at, ok, tt.path, tt.at)
		}
	}
	if _, _, ok := l.Last(0); ok {
		t.Error("Last(0) found a field")
	}
}

func TestParseSyntax(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		data         string
		line, column int
		end          bool
		context      string // and where it starts, "line:column"
		last         string // the field at or before the error, "" for none
	}{
		{"unclosed list on the first line", "plans: [", 1, 9, true, "", "plans"},
		{"a value that is a mapping again", "plans:\n  free:\n    quotas: []\n  pro: x: y\n", 4, 9, false, "", "plans.pro"},
		{"a tab", "plans:\n\tfree: {}\n", 2, 1, false, "", "plans"},
		{"unclosed flow mapping", "plans:\n  free: {quotas: [{limit: 1, period: 1m}]}\n  pro: {ban: off\n", 4, 1, true, "a flow mapping 3:8", "plans.free.quotas[0].period"},
		{"unclosed flow mapping before a line", "plans:\n  pro: {ban: off\n  free: {}\n", 3, 7, false, "a flow mapping 2:8", "plans"},
		{"unclosed quotation mark", "plans:\n  pro: \"off\n\n", 4, 1, true, "a quoted scalar 2:8", "plans"},
		{"a key indented too far", "plans:\n  free:\n    quotas: [{limit: 1, period: 1m}]\n   pro: {}\n", 4, 4, false, "", "plans.free.quotas[0].period"},
		{"nothing parses", "[\n", 2, 1, true, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v map[string]any
			err := yaml.Unmarshal([]byte(tt.data), &v)
			s, ok := ParseSyntax([]byte(tt.data), err)
			if !ok || s.Line != tt.line || s.Column != tt.column || s.End != tt.end || s.Message == "" || strings.HasPrefix(s.Message, "yaml:") {
				t.Fatalf("ParseSyntax(%v) = %+v, %v; want line %d, column %d, end %v", err, s, ok, tt.line, tt.column, tt.end)
			}
			if got := fmt.Sprintf("%s %d:%d", s.Context, s.ContextLine, s.ContextColumn); s.Context != "" || tt.context != "" {
				if got != tt.context {
					t.Errorf("context %q, want %q", got, tt.context)
				}
			}
			path, _, found := s.Lines.Last(s.Line)
			if path != tt.last || found != (tt.last != "") {
				t.Errorf("field at or before line %d = %q, want %q", s.Line, path, tt.last)
			}
		})
	}
	if _, ok := ParseSyntax([]byte("a: 1"), errors.New("other")); ok {
		t.Error("a plain error parsed as a syntax error")
	}
	if _, ok := ParseSyntax([]byte("a: 1"), nil); ok {
		t.Error("no error parsed as a syntax error")
	}
}

func TestSyntaxWhere(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		s    Syntax
		want string
	}{
		{Syntax{Line: 4, Column: 9}, "line 4, column 9"},
		{Syntax{Line: 4, Column: 1, End: true}, "line 4, column 1, the end of the file"},
		{Syntax{Line: 2}, "line 2"},
	} {
		if got := tt.s.Where(); got != tt.want {
			t.Errorf("%+v: Where() = %q, want %q", tt.s, got, tt.want)
		}
	}
}
