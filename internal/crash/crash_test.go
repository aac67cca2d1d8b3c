package crash

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPointsRegistered reads every Go source file of the module: each
// crash.Point call names, as a string literal, a point of Points, no point
// is passed twice, and every point of Points is passed somewhere.
func TestPointsRegistered(t *testing.T) {
	seen := map[string]string{} // point -> where it is passed
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Point" {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "crash" {
				return true
			}
			where := fset.Position(call.Pos()).String()
			lit, ok := call.Args[0].(*ast.BasicLit)
			if len(call.Args) != 1 || !ok || lit.Kind != token.STRING {
				t.Errorf("%s: crash.Point takes one string literal", where)
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			if !slices.Contains(Points, name) {
				t.Errorf("%s: point %q is not in crash.Points", where, name)
			}
			if prev, ok := seen[name]; ok {
				t.Errorf("%s: point %q is passed at %s already", where, name, prev)
			}
			seen[name] = where
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Points {
		if _, ok := seen[p]; !ok {
			t.Errorf("point %q is in crash.Points but never passed to crash.Point", p)
		}
	}
	if dup := len(Points) - len(uniq(Points)); dup != 0 {
		t.Errorf("crash.Points names %d points twice", dup)
	}
	if len(seen) == 0 {
		t.Fatal("found no crash.Point call: is the walk at the module's root?")
	}
}

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
