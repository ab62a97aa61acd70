package deploy

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// deployment is the deployment files parsed: the checks read these
// structures, never the text, so a reformatted file checks the same.
type deployment struct {
	compose map[string]map[string]any // compose file -> document
	kube    map[string]map[string]any // kind -> manifest (Deployment, Service, ...)
	unit    map[string][]string       // systemd "Section.Key" -> its values, in order
	docker  []instruction             // the Dockerfile
	ignore  []string                  // .dockerignore's patterns
	haproxy map[string][][]string     // "defaults", "backend relays", ... -> lines as fields
	goMod   string                    // go.mod's go version
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct{ cmd, args string }

func load(tb testing.TB) *deployment {
	tb.Helper()
	d := &deployment{compose: map[string]map[string]any{}, kube: map[string]map[string]any{}, unit: map[string][]string{}, haproxy: map[string][][]string{}}
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			tb.Fatal(err)
		}
		return string(b)
	}
	for _, f := range []string{"compose.yaml", "compose.replicas.yaml"} {
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(read(f)), &doc); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		d.compose[f] = doc
	}
	kube, _ := filepath.Glob("../deploy/kubernetes/*.yaml")
	for _, f := range kube {
		dec := yaml.NewDecoder(strings.NewReader(read(strings.TrimPrefix(f, "../"))))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				tb.Fatalf("%s: %v", f, err)
			}
			d.kube[str(doc["kind"])] = doc
		}
	}
	section := ""
	for _, line := range lines(read("deploy/relay.service"), "#;") {
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
		} else if k, v, ok := strings.Cut(line, "="); ok {
			d.unit[section+"."+k] = append(d.unit[section+"."+k], v)
		}
	}
	docker := strings.ReplaceAll(read("Dockerfile"), "\\\n", " ")
	for _, line := range lines(docker, "#") {
		cmd, args, _ := strings.Cut(line, " ")
		d.docker = append(d.docker, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
	}
	d.ignore = lines(read(".dockerignore"), "#")
	for _, line := range strings.Split(read("deploy/haproxy.cfg"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
			if line[0] != ' ' && line[0] != '\t' {
				section = strings.Join(f, " ")
			} else {
				d.haproxy[section] = append(d.haproxy[section], f)
			}
		}
	}
	d.goMod = regexp.MustCompile(`(?m)^go (\S+)`).FindStringSubmatch(read("go.mod"))[1]
	return d
}

// lines are the text's lines, trimmed, without blank ones and comments.
func lines(text, comment string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.ContainsAny(l[:1], comment) {
			out = append(out, l)
		}
	}
	return out
}

// dig walks maps by key and lists by index ("0"); nil where the path ends.
func dig(v any, path ...string) any {
	for _, p := range path {
		switch m := v.(type) {
		case map[string]any:
			v = m[p]
		case []any:
			i := int(p[0] - '0')
			if len(p) != 1 || i >= len(m) {
				return nil
			}
			v = m[i]
		default:
			return nil
		}
	}
	return v
}

func str(v any) string {
	if v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

func strs(v any) []string {
	l, _ := v.([]any)
	out := make([]string, len(l))
	for i, e := range l {
		out[i] = str(e)
	}
	return out
}

// dockerLast is the last instruction cmd of the final stage, "" for none.
func (d *deployment) dockerLast(cmd string) string {
	out := ""
	for _, in := range d.docker {
		if in.cmd == "FROM" {
			out = ""
		} else if in.cmd == cmd {
			out = in.args
		}
	}
	return out
}

// dockerEnv is the ENV of the Dockerfile's final stage: what the image
// gives the relay before compose or Kubernetes add theirs.
func (d *deployment) dockerEnv() map[string]string {
	env := map[string]string{}
	for _, in := range d.docker {
		if in.cmd == "FROM" {
			clear(env)
		} else if in.cmd == "ENV" {
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	return env
}

// execForm reads a JSON array instruction argument (CMD ["/relay", ...]).
func execForm(s string) []string {
	var out []string
	_ = json.Unmarshal([]byte(s), &out)
	return out
}
