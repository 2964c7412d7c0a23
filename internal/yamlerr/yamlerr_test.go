package yamlerr

import (
	"bytes"
	"errors"
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
	var d doc
	if err := DecodeStrict([]byte(""), &d, "test file"); err != nil || d != (doc{}) {
		t.Errorf("empty file: %v %+v", err, d)
	}
	if err := DecodeStrict([]byte("name: a\ncount: 2\n"), &d, "test file"); err != nil || d != (doc{Name: "a", Count: 2}) {
		t.Errorf("one document: %v %+v", err, d)
	}
	if err := DecodeStrict([]byte("name: a\n---\nname: b\n"), &d, "test file"); err == nil || err.Error() != "a test file holds a single YAML document" {
		t.Errorf("two documents: %v", err)
	}
	err := DecodeStrict([]byte("nope: 1\n"), &d, "test file")
	if _, ps, ok := Problems([]byte("nope: 1\n"), err); !ok || len(ps) != 1 || ps[0].Kind != UnknownField {
		t.Errorf("unknown field: %v", err)
	}
}
