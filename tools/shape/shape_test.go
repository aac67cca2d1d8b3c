// Package shape holds a test of the project's shape, the two bounds
// docs/dev/architecture.md sets so that no package or type becomes the
// place everything goes: no package over maxShare of the module's non-test
// Go lines, and no type over maxMethods methods (counting those promoted
// from a type of its package it embeds).
package shape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	maxShare   = 0.12
	maxMethods = 60
)

// exempt are the types allowed past maxMethods, and why.
var exempt = map[string]string{
	// The Go SDK: one method per route of the API, the names the docs
	// give users. Splitting it would change what users call.
	"client.Client": "the Go SDK's one client",
}

// skipDir are the directories that are not the module's Go code.
func skipDir(rel string) bool {
	switch rel {
	case "sdk", "web", "tools/runsc", ".git":
		return true
	}
	base := filepath.Base(rel)
	return base == "testdata" || base == "node_modules" || strings.HasPrefix(base, ".")
}

func TestShape(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("not the module's root: %v", err)
	}
	lines := map[string]int{} // package dir -> non-test lines
	total := 0
	methods := map[string]int{}     // "dir.Type" -> methods declared
	embeds := map[string][]string{} // "dir.Type" -> "dir.Embedded"
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && skipDir(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir := filepath.Dir(rel)
		n := strings.Count(string(src), "\n")
		lines[dir] += n
		total += n
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv != nil {
					methods[dir+"."+typeName(decl.Recv.List[0].Type)]++
				}
			case *ast.GenDecl:
				for _, s := range decl.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, field := range st.Fields.List {
						if name := typeName(field.Type); len(field.Names) == 0 && name != "" {
							embeds[dir+"."+ts.Name.Name] = append(embeds[dir+"."+ts.Name.Name], dir+"."+name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total < 10000 || methods["internal/sandbox.Manager"] == 0 {
		t.Fatalf("read %d lines, %d methods of internal/sandbox.Manager: is the test reading the module?", total, methods["internal/sandbox.Manager"])
	}
	var biggest, most string
	for dir, n := range lines {
		if share := float64(n) / float64(total); share > maxShare {
			t.Errorf("%s holds %.1f%% of the module's %d non-test Go lines, more than %.0f%%: move a capability into a package of its own", dir, 100*share, total, 100*maxShare)
		}
		if biggest == "" || n > lines[biggest] {
			biggest = dir
		}
	}
	counts := map[string]int{}
	for typ, n := range methods {
		for _, e := range embeds[typ] {
			n += methods[e]
		}
		counts[typ] = n
		if n > maxMethods && exempt[typ] == "" {
			t.Errorf("%s has %d methods (counting promoted ones), more than %d: give a job of its own to a type of its own", typ, n, maxMethods)
		}
		if exempt[typ] == "" && (most == "" || n > counts[most]) {
			most = typ
		}
	}
	// The figures the bounds hold, for a change's note (go test -v).
	t.Logf("largest package %s: %.1f%% of %d non-test Go lines; most methods, of the types not exempt: %s, %d",
		biggest, 100*float64(lines[biggest])/float64(total), total, most, counts[most])
}

// typeName names the type of a receiver or an embedded field: T for T, *T,
// T[P] or *T[P]; "" for one of another package.
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.IndexExpr:
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}
