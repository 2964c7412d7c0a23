// Package yamlerr turns the decoding errors of go.yaml.in/yaml/v3 into
// structured problems, so that each file format (plans, keys) can word them
// in its own terms and point at the field or entry they are about.
package yamlerr

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Kind says what went wrong.
type Kind int

// Kinds of problems the decoder reports.
const (
	Other Kind = iota
	UnknownField
	TypeMismatch
	Duplicate
)

// Problem is one message of a *yaml.TypeError, parsed.
type Problem struct {
	// Line is the 1-based line the problem is on; 0 when the decoder gave none.
	Line int
	Kind Kind
	// Field names the field, for UnknownField and Duplicate.
	Field string
	// Tag is the YAML tag found (e.g. "!!str"), for TypeMismatch.
	Tag string
	// Value is the scalar found, possibly cut short with "...", for
	// TypeMismatch; empty for mappings and lists.
	Value string
	// Into is the Go type the decoder wanted, for TypeMismatch.
	Into string
	// FirstLine is where a Duplicate field was first defined.
	FirstLine string
	// Message is the decoder's own text, without the line.
	Message string
}

// The messages of a *yaml.TypeError, one per problem, each starting with
// the line it is on.
var (
	lineRE     = regexp.MustCompile(`^line (\d+): (.*)$`)
	unknownRE  = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	mismatchRE = regexp.MustCompile("^cannot unmarshal (!!\\w+)(?: `(.*)`)? into (.+)$")
	twiceRE    = regexp.MustCompile(`^mapping key "(.*)" already defined at line (\d+)$`)
)

// Problems parses err when it is a *yaml.TypeError, and returns the
// document data as nodes for locating the problems in it. ok is false when
// err is another error or data does not parse as YAML.
func Problems(data []byte, err error) (root *yaml.Node, problems []Problem, ok bool) {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return nil, nil, false
	}
	root = new(yaml.Node)
	if yaml.Unmarshal(data, root) != nil {
		return nil, nil, false
	}
	problems = make([]Problem, 0, len(te.Errors))
	for _, e := range te.Errors {
		problems = append(problems, parse(e))
	}
	return root, problems, true
}

func parse(e string) Problem {
	m := lineRE.FindStringSubmatch(e)
	if m == nil {
		return Problem{Message: e}
	}
	line, _ := strconv.Atoi(m[1])
	p := Problem{Line: line, Message: m[2]}
	if sm := unknownRE.FindStringSubmatch(p.Message); sm != nil {
		p.Kind, p.Field = UnknownField, sm[1]
	} else if sm := mismatchRE.FindStringSubmatch(p.Message); sm != nil {
		p.Kind, p.Tag, p.Value, p.Into = TypeMismatch, sm[1], sm[2], sm[3]
	} else if sm := twiceRE.FindStringSubmatch(p.Message); sm != nil {
		p.Kind, p.Field, p.FirstLine = Duplicate, sm[1], sm[2]
	}
	return p
}

// ErrEmpty is DecodeStrict's error for a file that holds no YAML document,
// or an empty one: nothing, blank lines and comments, "---" or null.
var ErrEmpty = errors.New("the file is empty")

// ExtraDocumentError is DecodeStrict's error for a file that holds more
// than one YAML document.
type ExtraDocumentError struct {
	// Name says what the file is ("plans file").
	Name string
	// Line is where the second document starts: its "---".
	Line int
	// Document is the second document, for naming what it holds.
	Document *yaml.Node
}

func (e *ExtraDocumentError) Error() string {
	return fmt.Sprintf("line %d: a second YAML document starts here: a %s holds a single YAML document", e.Line, e.Name)
}

// DecodeStrict decodes data, a file holding one YAML document, into v,
// refusing unknown fields. A file with no document is ErrEmpty and leaves
// v as it is; one with a second document is an *ExtraDocumentError. name
// says what the file is ("plans file"); decoding errors are returned as
// the decoder made them, for Problems and ParseSyntax.
func DecodeStrict(data []byte, v any, name string) error {
	var first yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&first); errors.Is(err, io.EOF) || (err == nil && isNull(&first)) {
		return ErrEmpty
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return err
	}
	extra := new(yaml.Node)
	if err := dec.Decode(extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return err // the second document is not even YAML
		}
		return &ExtraDocumentError{Name: name, Line: extra.Line, Document: extra}
	}
	return nil
}

// isNull reports whether a document holds nothing: "---" alone, or null.
func isNull(doc *yaml.Node) bool {
	return doc.Kind == yaml.DocumentNode && (len(doc.Content) == 0 ||
		(doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].ShortTag() == "!!null"))
}
