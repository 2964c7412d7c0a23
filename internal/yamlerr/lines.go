package yamlerr

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	yaml4 "go.yaml.in/yaml/v4"
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
	// Line and Column (1-based) are where the parser stopped: the first
	// character it could not take. Column is 0 when unknown.
	Line, Column int
	// End reports that the parser stopped at the end of the file: a
	// bracket or quotation mark was left open.
	End bool
	// Message is the parser's text, without a position.
	Message string
	// Context, when the parser stopped inside a construct that an
	// unclosed bracket or quotation mark leaves open, says what it was
	// parsing ("a flow mapping", "a quoted scalar"); ContextLine and
	// ContextColumn are where that starts. Empty otherwise.
	Context                    string
	ContextLine, ContextColumn int
	// Lines indexes the part of the file before the error that parses,
	// for naming the field at or before Line; it holds the field that
	// starts Line itself when that much of the line parses.
	Lines *Lines
	data  []byte
}

var syntaxRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// ParseSyntax reports whether err, an error of go.yaml.in/yaml/v3 decoding
// data, is a YAML syntax error and, if so, where the parser stopped.
//
// v3 words the error with the line of the construct the parser was in (and
// for the parser's errors, that line less one), not where it stopped; so
// data is parsed again with go.yaml.in/yaml/v4, which gives that place,
// line and column. Where v4 finds no such error, v3's line stands.
func ParseSyntax(data []byte, err error) (Syntax, bool) {
	if err == nil {
		return Syntax{}, false
	}
	m := syntaxRE.FindStringSubmatch(err.Error())
	if m == nil {
		return Syntax{}, false
	}
	s := Syntax{Message: m[2], data: data}
	s.Line, _ = strconv.Atoi(m[1])
	if le, ok := stopped(data); ok {
		s.Line, s.Column, s.Message = le.Mark.Line, le.Mark.Column, le.Message
		if s.End = atEnd(data, s.Line, s.Column); s.End {
			// Past a last line without a newline, the parser counts
			// one line more than an editor shows.
			s.Line, s.Column = end(data)
		}
		if c := le.ContextMark; le.ContextMsg != "" && c.Line > 0 && c != le.Mark {
			what := strings.TrimPrefix(strings.TrimPrefix(le.ContextMsg, "while parsing "), "while scanning ")
			if strings.Contains(what, "flow") || strings.Contains(what, "quoted") {
				s.Context, s.ContextLine, s.ContextColumn = what, c.Line, c.Column
			}
		}
	}
	s.Lines = Index(prefix(data, s.Line))
	return s, true
}

// stopped parses every document of data with go.yaml.in/yaml/v4 and
// returns its first syntax error, which carries where the parser stopped.
func stopped(data []byte) (*yaml4.LoadError, bool) {
	l, err := yaml4.NewLoader(bytes.NewReader(data))
	if err != nil {
		return nil, false
	}
	for {
		var n yaml4.Node
		err := l.Load(&n)
		if err == nil {
			continue
		}
		le, ok := errors.AsType[*yaml4.LoadError](err)
		if !ok || le.Mark.Line == 0 {
			return nil, false
		}
		switch le.Stage {
		case yaml4.ReaderStage, yaml4.ScannerStage, yaml4.ParserStage:
			return le, true
		}
		return nil, false
	}
}

// atEnd reports whether nothing but white space follows line and column
// (1-based) of data.
func atEnd(data []byte, line, column int) bool {
	lines := strings.Split(string(data), "\n")
	if line > len(lines) {
		return true
	}
	rest := []rune(lines[line-1])
	rest = rest[min(max(column-1, 0), len(rest)):]
	return strings.TrimSpace(string(rest)+strings.Join(lines[line:], "\n")) == ""
}

// end returns the line and column (1-based) just past the last character
// of data, as an editor counts them.
func end(data []byte) (line, column int) {
	lines := strings.Split(string(data), "\n")
	return len(lines), len([]rune(lines[len(lines)-1])) + 1
}

// Where says where the parser stopped: "line 4, column 9", and that it is
// the end of the file when it is.
func (s Syntax) Where() string {
	w := fmt.Sprintf("line %d", s.Line)
	if s.Column > 0 {
		w += fmt.Sprintf(", column %d", s.Column)
	}
	if s.End {
		w += ", the end of the file"
	}
	return w
}

// Field returns the field or entry of the file that starts last at or
// before line, of the part of the file up to line that parses.
func (s Syntax) Field(line int) (path string, at int, ok bool) {
	return Index(prefix(s.data, line)).Last(line)
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
