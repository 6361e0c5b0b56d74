package tarball

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// notRules are the package's exported error values that no *PolicyError
// or *LayoutError carries: a malformed archive (*FormatError) and running
// out of resources.
var notRules = map[string]bool{"ErrMalformed": true, "ErrExhausted": true}

// TestEveryRuleListed walks the package's source: every exported Err*
// variable is made by newRule (so Rules lists it) or newLayoutRule (so
// LayoutRules does), unless it is one of notRules; and the lists hold
// each rule once with a distinct message, which is what a caller labels a
// rejection by. A rule added with errors.New would be missed by whoever
// counts rejections by Rules: this test fails instead.
func TestEveryRuleListed(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	made := map[string]int{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Err") || !n.IsExported() || notRules[n.Name] {
						continue
					}
					maker := ""
					if i < len(vs.Values) {
						if call, ok := vs.Values[i].(*ast.CallExpr); ok {
							if id, ok := call.Fun.(*ast.Ident); ok {
								maker = id.Name
							}
						}
					}
					switch maker {
					case "newRule", "newLayoutRule":
						made[maker]++
					default:
						t.Errorf("%s: %s is not made by newRule or newLayoutRule: Rules and LayoutRules miss it", fset.Position(n.Pos()), n.Name)
					}
				}
			}
		}
	}
	for maker, list := range map[string][]error{"newRule": Rules(), "newLayoutRule": LayoutRules()} {
		if len(list) != made[maker] {
			t.Errorf("%d variables made by %s, its list holds %d", made[maker], maker, len(list))
		}
		seen := map[string]bool{}
		for _, r := range list {
			if seen[r.Error()] {
				t.Errorf("two rules of %s say %q", maker, r)
			}
			seen[r.Error()] = true
		}
	}
	if made["newRule"] == 0 || made["newLayoutRule"] == 0 {
		t.Fatalf("no rule found in the source (%v): the walk proves nothing", made)
	}
}
