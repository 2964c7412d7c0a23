package ratelimit

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layers are the package's files in the order a decision goes down them
// (README.md, How a decision is made), top first. A function may call or
// name one in its own layer or below, never above: a decision goes down
// once and comes back up once. Methods of entryTypes are entry points
// wherever they are written (finalize.go's Limiter.Finalize, for example).
// A closure that limiter.go hands down (a breaker's clock, the batcher's
// report of a round trip) counts as limiter.go's, where the wiring is read.
var layers = []struct {
	name  string
	files []string
}{
	{"entry points", []string{"limiter.go", "admin.go", "simulate.go", "throttle.go"}},
	{"rejection cache", []string{"cache.go"}},
	{"grants", []string{"lease.go", "giveback.go"}},
	{"batcher", []string{"batch.go"}},
	{"degraded mode", []string{"degraded.go"}},
	{"deciders", []string{"decider.go", "redisdecider.go", "localdecider.go", "state.go"}},
	{"the fleet's state", []string{"replicas.go", "finalize.go", "registry.go"}},
	{"plans, policies, records, options, metrics", []string{"plan.go", "policy.go", "format.go", "options.go", "metrics.go", "doc.go"}},
}

var entryTypes = []string{"Limiter", "Throttle", "Simulator"}

// TestNoLayerCallsUp type-checks the package's own files and fails for
// every reference from a function to a function or method of a layer above
// its own, and for a file no layer lists.
func TestNoLayerCallsUp(t *testing.T) {
	fset := token.NewFileSet()
	files, err := packageFiles(fset)
	if err != nil {
		t.Fatal(err)
	}
	rankOf := map[string]int{}
	for i, l := range layers {
		for _, f := range l.files {
			rankOf[f] = i
		}
	}
	for _, f := range files {
		name := filepath.Base(fset.Position(f.Pos()).Filename)
		if _, ok := rankOf[name]; !ok {
			t.Errorf("%s is in no layer: add it to layers, where its functions are called from", name)
		}
	}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: exportImporter(t, fset)}
	pkg, err := conf.Check("github.com/animal-store/petstore/ratelimit", fset, files, info)
	if err != nil {
		t.Fatal(err)
	}
	// rank is the layer of a function, or -1 for one not of this package.
	rank := func(obj types.Object) int {
		fn, ok := obj.(*types.Func)
		if !ok || fn.Pkg() != pkg {
			return -1
		}
		if recv := fn.Signature().Recv(); recv != nil {
			typ := recv.Type()
			if p, ok := typ.(*types.Pointer); ok {
				typ = p.Elem()
			}
			if n, ok := typ.(*types.Named); ok && slices.Contains(entryTypes, n.Obj().Name()) {
				return 0
			}
		}
		r, ok := rankOf[filepath.Base(fset.Position(fn.Pos()).Filename)]
		if !ok {
			return -1
		}
		return r
	}
	checked := 0
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			from := rank(info.Defs[fd.Name])
			checked++
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				id, ok := n.(*ast.Ident)
				if !ok {
					return true
				}
				if to := rank(info.Uses[id]); to >= 0 && to < from {
					t.Errorf("%s: %s (%s) calls up into %s (%s)", fset.Position(id.Pos()), fd.Name.Name, layers[from].name, id.Name, layers[to].name)
				}
				return true
			})
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d functions: the package's files were not all read", checked)
	}
}

// packageFiles parses the package's non-test files in this directory.
func packageFiles(fset *token.FileSet) ([]*ast.File, error) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// exportImporter imports the package's dependencies from the export data
// the go command builds for them (go list -export).
func exportImporter(t *testing.T, fset *token.FileSet) types.Importer {
	cmd := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}
