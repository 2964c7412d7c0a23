package plan

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The messages of a *yaml.TypeError, one per problem, each starting with
// the line it is on.
var (
	lineRE     = regexp.MustCompile(`^line (\d+): (.*)$`)
	unknownRE  = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	mismatchRE = regexp.MustCompile("^cannot unmarshal (!!\\w+)(?: `(.*)`)? into (.+)$")
	twiceRE    = regexp.MustCompile(`^mapping key "(.*)" already defined at line (\d+)$`)
)

// locate rewrites a decoding error so that each problem names the field it
// is about (plans.free.quotas[0].limit) in the file's terms rather than in
// the decoder's Go types.
func locate(data []byte, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return err
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		msgs = append(msgs, describe(&root, e))
	}
	return errors.New(strings.Join(msgs, "; "))
}

func describe(root *yaml.Node, e string) string {
	m := lineRE.FindStringSubmatch(e)
	if m == nil {
		return e
	}
	line, _ := strconv.Atoi(m[1])
	msg := m[2]
	onLine := func(n *yaml.Node) bool { return n.Line == line }
	var (
		path string
		ok   bool
	)
	switch {
	case unknownRE.MatchString(msg):
		name := unknownRE.FindStringSubmatch(msg)[1]
		path, ok = findPath(root, "", func(k *yaml.Node) bool { return onLine(k) && k.Value == name }, nil)
		msg = "unknown field"
	case mismatchRE.MatchString(msg):
		sm := mismatchRE.FindStringSubmatch(msg)
		tag, value, into := sm[1], sm[2], sm[3]
		prefix := strings.TrimSuffix(value, "...")
		path, ok = findPath(root, "", nil, func(v *yaml.Node) bool {
			if !onLine(v) || v.ShortTag() != tag {
				return false
			}
			return v.Kind != yaml.ScalarNode || strings.HasPrefix(v.Value, prefix)
		})
		got := kindWord(tag)
		if value != "" {
			got += " " + strconv.Quote(value)
		}
		msg = fmt.Sprintf("want %s, got %s", typeWord(into), got)
	case twiceRE.MatchString(msg):
		sm := twiceRE.FindStringSubmatch(msg)
		path, ok = findPath(root, "", func(k *yaml.Node) bool { return onLine(k) && k.Value == sm[1] }, nil)
		msg = "defined twice (first at line " + sm[2] + ")"
	}
	if !ok {
		return fmt.Sprintf("line %d: %s", line, msg)
	}
	return fmt.Sprintf("%s (line %d): %s", path, line, msg)
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
