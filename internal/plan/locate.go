package plan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/animal-store/petstore/internal/yamlerr"
)

// locate rewrites a decoding error so that each problem names the field it
// is about (plans.free.quotas[0].limit) in the file's terms rather than in
// the decoder's Go types.
func locate(data []byte, err error) error {
	var extra *yamlerr.ExtraDocumentError
	switch {
	case errors.Is(err, yamlerr.ErrEmpty):
		return errors.New(`plans (line 1): required, and the file is empty; write "plans: {}" to keep the built-in plans as they are`)
	case errors.As(err, &extra):
		if path, line, ok := yamlerr.Index(extra.Document).First(); ok {
			return fmt.Errorf("%s (line %d): in a second YAML document, which starts on line %d: a plans file holds a single YAML document", path, line, extra.Line)
		}
		return err
	}
	if s, ok := yamlerr.ParseSyntax(data, err); ok {
		return syntaxError(s)
	}
	root, problems, ok := yamlerr.Problems(data, err)
	if !ok {
		return err
	}
	msgs := make([]string, 0, len(problems))
	for _, p := range problems {
		msgs = append(msgs, describe(root, p))
	}
	return errors.New(strings.Join(msgs, "; "))
}

// syntaxError says where the parser stopped reading a file that is not
// YAML, and in which field: the one starting on that line, else the last
// before it or, for a bracket or quotation mark left open, the one it
// opens in.
func syntaxError(s yamlerr.Syntax) error {
	msg := "not YAML: " + s.Message
	if s.Context != "" {
		in := fmt.Sprintf("line %d, column %d", s.ContextLine, s.ContextColumn)
		if path, at, ok := s.Field(s.ContextLine); ok && at == s.ContextLine {
			in = path + ", " + in
		}
		msg += fmt.Sprintf(" while parsing %s (%s)", s.Context, in)
	}
	path, at, found := s.Lines.Last(s.Line)
	switch {
	case found && at == s.Line:
		return fmt.Errorf("%s (%s): %s", path, s.Where(), msg)
	case found && s.Context == "":
		return fmt.Errorf("%s: %s (after %s, line %d)", s.Where(), msg, path, at)
	}
	return fmt.Errorf("%s: %s", s.Where(), msg)
}

// place names the line of each problem found after decoding.
func place(data []byte, problems []problem) error {
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // it decoded before
	lines := yamlerr.Index(&root)
	msgs := make([]string, 0, len(problems))
	for _, p := range problems {
		if line, ok := lines.Line(p.path); ok {
			msgs = append(msgs, fmt.Sprintf("%s (line %d): %s", p.path, line, p.msg))
		} else {
			msgs = append(msgs, p.path+": "+p.msg)
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

func describe(root *yaml.Node, p yamlerr.Problem) string {
	if p.Line == 0 {
		return p.Message
	}
	onLine := func(n *yaml.Node) bool { return n.Line == p.Line }
	var (
		path string
		ok   bool
		msg  = p.Message
	)
	switch p.Kind {
	case yamlerr.UnknownField:
		path, ok = findPath(root, "", func(k *yaml.Node) bool { return onLine(k) && k.Value == p.Field }, nil)
		msg = "unknown field"
	case yamlerr.TypeMismatch:
		prefix := strings.TrimSuffix(p.Value, "...")
		path, ok = findPath(root, "", nil, func(v *yaml.Node) bool {
			if !onLine(v) || v.ShortTag() != p.Tag {
				return false
			}
			return v.Kind != yaml.ScalarNode || strings.HasPrefix(v.Value, prefix)
		})
		got := kindWord(p.Tag)
		if p.Value != "" {
			got += " " + strconv.Quote(p.Value)
		}
		msg = fmt.Sprintf("want %s, got %s", typeWord(p.Into), got)
	case yamlerr.Duplicate:
		path, ok = findPath(root, "", func(k *yaml.Node) bool { return onLine(k) && k.Value == p.Field }, nil)
		msg = "defined twice (first at line " + p.FirstLine + ")"
	}
	if !ok {
		return fmt.Sprintf("line %d: %s", p.Line, msg)
	}
	return fmt.Sprintf("%s (line %d): %s", path, p.Line, msg)
}

// findPath returns the path to the first mapping key matching key, or to the
// value matching value, in document order; among nested values the innermost
// wins, since a mapping starts on the line of its first key.
func findPath(n *yaml.Node, path string, key, value func(*yaml.Node) bool) (string, bool) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p, ok := findPath(c, path, key, value); ok {
				return p, true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if key != nil && key(k) {
				return p, true
			}
			if p, ok := findPath(v, p, key, value); ok {
				return p, true
			}
			if value != nil && value(v) {
				return p, true
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if p, ok := findPath(c, p, key, value); ok {
				return p, true
			}
			if value != nil && value(c) {
				return p, true
			}
		}
	}
	return "", false
}

// typeWord names a decoding target in the file's terms.
func typeWord(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "a whole number"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case goType == "plan.banSpec":
		return `"off" or a mapping`
	default:
		return "a mapping"
	}
}

// kindWord names a YAML tag for people.
func kindWord(tag string) string {
	switch tag {
	case "!!str":
		return "text"
	case "!!int":
		return "a whole number"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "nothing"
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	default:
		return tag
	}
}
