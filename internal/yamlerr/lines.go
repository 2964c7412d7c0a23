package yamlerr

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Lines maps the paths of a document's fields and list entries, written as
// the file formats name them in errors (plans.free.quotas[0].limit), to the
// lines they start on, so that a check made after decoding can point at
// the line it is about.
type Lines struct {
	at    map[string]int
	order []string // document order
}

// Index returns the paths of root, a document or any node in one.
func Index(root *yaml.Node) *Lines {
	l := &Lines{at: make(map[string]int)}
	if root != nil {
		l.walk(root, "")
	}
	return l
}

func (l *Lines) add(path string, line int) {
	if _, dup := l.at[path]; dup || path == "" {
		return
	}
	l.at[path] = line
	l.order = append(l.order, path)
}

func (l *Lines) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			l.walk(c, path)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			l.add(p, k.Line)
			l.walk(n.Content[i+1], p)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			l.add(p, c.Line)
			l.walk(c, p)
		}
	}
}

// Line returns the line of path or, when the file does not have it (a
// required field left out), of the nearest field or entry enclosing it.
// ok is false when not even the first part of path is in the file.
func (l *Lines) Line(path string) (line int, ok bool) {
	for p := path; p != ""; p = parent(p) {
		if line, ok := l.at[p]; ok {
			return line, true
		}
	}
	return 0, false
}

// parent cuts the last part (".name" or "[i]") off path.
func parent(path string) string {
	if strings.HasSuffix(path, "]") {
		if i := strings.LastIndexByte(path, '['); i >= 0 {
			return path[:i]
		}
	}
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i]
	}
	return ""
}

// First returns the document's first field or entry.
func (l *Lines) First() (path string, line int, ok bool) {
	if len(l.order) == 0 {
		return "", 0, false
	}
	return l.order[0], l.at[l.order[0]], true
}

// Last returns the field or entry that starts last at or before line; of
// those on one line, the innermost.
func (l *Lines) Last(line int) (path string, at int, ok bool) {
	for _, p := range l.order {
		if n := l.at[p]; n <= line && n >= at {
			path, at, ok = p, n, true
		}
	}
	return path, at, ok
}

// Syntax is a YAML syntax error: the file is not YAML from Line on.
type Syntax struct {
	// Line is the 1-based line the decoder gave.
	Line int
	// Message is the decoder's text without its "yaml: line N: " prefix.
	Message string
	// Lines indexes the part of the file before the error that parses,
	// for naming the field at or before Line; it holds the field that
	// starts Line itself when that much of the line parses.
	Lines *Lines
}

var syntaxRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// ParseSyntax reports whether err is a YAML syntax error in data and, if
// so, where.
func ParseSyntax(data []byte, err error) (Syntax, bool) {
	if err == nil {
		return Syntax{}, false
	}
	m := syntaxRE.FindStringSubmatch(err.Error())
	if m == nil {
		return Syntax{}, false
	}
	line, _ := strconv.Atoi(m[1])
	return Syntax{Line: line, Message: m[2], Lines: Index(prefix(data, line))}, true
}

// prefix returns the longest start of data, up to line, that parses: the
// lines before it with the key that starts line (so "  pro: x: y" still
// names pro), else fewer lines. It returns nil when nothing parses.
func prefix(data []byte, line int) *yaml.Node {
	lines := strings.Split(string(data), "\n")
	if line > len(lines) {
		line = len(lines)
	}
	try := func(text string) *yaml.Node {
		var n yaml.Node
		if yaml.Unmarshal([]byte(text), &n) != nil {
			return nil
		}
		return &n
	}
	if line >= 1 {
		at := lines[line-1]
		if i := strings.Index(at+" ", ": "); i > 0 {
			if n := try(strings.Join(append(lines[:line-1:line-1], at[:i+1]), "\n")); n != nil {
				return n
			}
		}
	}
	for n := line - 1; n > 0; n-- {
		if node := try(strings.Join(lines[:n], "\n")); node != nil {
			return node
		}
	}
	return nil
}
