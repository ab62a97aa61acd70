package clients

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestTypeScriptClient installs, compiles and runs the TypeScript client's
// own tests (npm test: node:test against relays started from the binary
// built here). Needs node and npm, and the npm registry for npm ci.
func TestTypeScriptClient(t *testing.T) {
	buildTypeScript(t)
	cmd := exec.Command("npm", "test")
	cmd.Dir = tsDir
	cmd.Env = append(cleanEnv(), "FN_TEST_RELAY_BIN="+relayBinary(t))
	dieWithTest(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm test: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^# pass [1-9]`).Match(out) || !regexp.MustCompile(`(?m)^# fail 0$`).Match(out) {
		t.Fatalf("npm test passed nothing:\n%s", out)
	}
	t.Logf("npm test: %s", regexp.MustCompile(`(?m)^# (tests|pass|fail) \d+$`).FindAll(out, -1))
}

// wireSchemas pairs each interface of typescript/src/wire.ts with the
// schema of docs/openapi.yaml it is the JSON form of.
var wireSchemas = map[string]string{
	"PushTarget":          "PushTarget",
	"PushKeys":            "PushKeys",
	"RegisterRequest":     "RegisterRequest",
	"RegisterResponse":    "RegisterResponse",
	"SendRequest":         "SendRequest",
	"Delivery":            "Delivery",
	"SendResponse":        "SendResponse",
	"Envelope":            "Envelope",
	"PollResponse":        "PollResponse",
	"AckRequest":          "AckRequest",
	"ErrorBody":           "Error",
	"Device":              "Device",
	"DevicesResponse":     "DevicesResponse",
	"InvitationRequest":   "InvitationRequest",
	"InvitationResponse":  "InvitationResponse",
	"Invitation":          "Invitation",
	"InvitationsResponse": "InvitationsResponse",
	"StreamEnd":           "StreamEnd",
}

// TestTypeScriptWireTypes holds the TypeScript client's wire types to
// docs/openapi.yaml: every interface has exactly its schema's properties,
// optional exactly where the schema does not require them, with the type
// the schema gives (integer: number, an object schema: its interface,
// arrays of either, a string enum: string or exactly its literals). It
// needs no node: it reads the sources.
func TestTypeScriptWireTypes(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(tsDir, "src", "wire.ts"))
	if err != nil {
		t.Fatal(err)
	}
	ifaces := parseInterfaces(t, string(src))
	var names []string
	for n := range ifaces {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, ok := wireSchemas[n]; !ok {
			t.Errorf("wire.ts: interface %s is paired with no schema (add it to wireSchemas)", n)
		}
	}
	schemaOf := map[string]string{} // schema name -> interface
	for iface, schema := range wireSchemas {
		schemaOf[schema] = iface
	}
	for iface, schemaName := range wireSchemas {
		fields, ok := ifaces[iface]
		if !ok {
			t.Errorf("wire.ts has no interface %s for schema %s", iface, schemaName)
			continue
		}
		ref := doc.Components.Schemas[schemaName]
		if ref == nil {
			t.Errorf("openapi.yaml has no schema %s (interface %s)", schemaName, iface)
			continue
		}
		s := ref.Value
		for prop, p := range s.Properties {
			f, ok := fields[prop]
			if !ok {
				t.Errorf("%s: schema %s has %q, the interface does not", iface, schemaName, prop)
				continue
			}
			required := slices.Contains(s.Required, prop)
			if f.optional == required {
				t.Errorf("%s.%s: optional %v, but the schema's required is %v", iface, prop, f.optional, s.Required)
			}
			if want := tsTypes(p, schemaOf); !slices.Contains(want, f.typ) {
				t.Errorf("%s.%s: type %q, want one of %q", iface, prop, f.typ, want)
			}
		}
		for prop := range fields {
			if _, ok := s.Properties[prop]; !ok {
				t.Errorf("%s.%s: not a property of schema %s", iface, prop, schemaName)
			}
		}
	}
}

type tsField struct {
	optional bool
	typ      string
}

// parseInterfaces reads `export interface Name { field?: type; ... }`
// blocks, skipping comments.
func parseInterfaces(t *testing.T, src string) map[string]map[string]tsField {
	src = regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(src, "")
	src = regexp.MustCompile(`//[^\n]*`).ReplaceAllString(src, "")
	out := map[string]map[string]tsField{}
	field := regexp.MustCompile(`^(\w+)(\??):\s*(.+?);?$`)
	for _, m := range regexp.MustCompile(`(?s)export interface (\w+) \{(.*?)\n\}`).FindAllStringSubmatch(src, -1) {
		fields := map[string]tsField{}
		for _, line := range strings.Split(m[2], "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			f := field.FindStringSubmatch(line)
			if f == nil {
				t.Fatalf("wire.ts: interface %s: cannot read %q", m[1], line)
			}
			fields[f[1]] = tsField{optional: f[2] == "?", typ: strings.TrimSpace(f[3])}
		}
		out[m[1]] = fields
	}
	if len(out) == 0 {
		t.Fatal("wire.ts: no interfaces found")
	}
	return out
}

// tsTypes is what a TypeScript field may be declared as for schema p.
func tsTypes(p *openapi3.SchemaRef, schemaOf map[string]string) []string {
	if iface, ok := schemaOf[strings.TrimPrefix(p.Ref, "#/components/schemas/")]; ok && p.Ref != "" {
		return []string{iface}
	}
	s := p.Value
	if s.Type.IncludesNull() && len(s.Type.Slice()) == 2 {
		// [T, 'null']: the TypeScript type is T's, or null.
		other := *s
		for _, typ := range s.Type.Slice() {
			if typ != "null" {
				other.Type = &openapi3.Types{typ}
			}
		}
		var out []string
		for _, t := range tsTypes(&openapi3.SchemaRef{Value: &other}, schemaOf) {
			out = append(out, t+" | null")
		}
		return out
	}
	switch {
	case s.Type.Is("integer"), s.Type.Is("number"):
		return []string{"number"}
	case s.Type.Is("boolean"):
		return []string{"boolean"}
	case s.Type.Is("array"):
		var out []string
		for _, it := range tsTypes(s.Items, schemaOf) {
			out = append(out, it+"[]")
		}
		return out
	case s.Type.Is("string"):
		if len(s.Enum) == 0 {
			return []string{"string"}
		}
		var lits []string
		for _, e := range s.Enum {
			lits = append(lits, `"`+e.(string)+`"`)
		}
		return []string{"string", strings.Join(lits, " | ")}
	}
	return nil
}
