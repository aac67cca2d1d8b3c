package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxMethods is issue 21's bound on a type's methods: past it, a type is
// doing several jobs and its commands belong on a type of their own.
const maxMethods = 60

// TestMethodsPerType keeps every type of the package, app and the command
// types embedding it included (with app's methods they promote), under
// maxMethods.
func TestMethodsPerType(t *testing.T) {
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	methods := map[string]int{}
	embedsApp := map[string]bool{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil {
					methods[receiverType(d.Recv.List[0].Type)]++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, field := range st.Fields.List {
						if len(field.Names) == 0 && receiverType(field.Type) == "app" {
							embedsApp[ts.Name.Name] = true
						}
					}
				}
			}
		}
	}
	if methods["app"] == 0 {
		t.Fatal("found no method of app: is the test reading the package?")
	}
	for typ, n := range methods {
		if embedsApp[typ] {
			n += methods["app"]
		}
		if n > maxMethods {
			t.Errorf("%s has %d methods (counting promoted ones), more than %d: move a capability's commands onto a type of their own", typ, n, maxMethods)
		}
	}
}

// receiverType names the type of a receiver or embedded field: T for T,
// *T, T[P] or *T[P].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
