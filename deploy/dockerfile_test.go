package deploy

import (
	"bufio"
	"net"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The Dockerfile and .dockerignore. The parser knows only what a
// Dockerfile like ours uses: stages, line continuations, exec-form lists.

type instruction struct {
	cmd  string // upper case
	args string
}

type stage struct {
	from, name string
	inst       []instruction
}

func parseDockerfile(src string) []stage {
	var stages []stage
	sc := bufio.NewScanner(strings.NewReader(src))
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				case st.from == "":
					st.from = f[i]
				}
			}
			stages = append(stages, st)
			return
		}
		if len(stages) > 0 {
			stages[len(stages)-1].inst = append(stages[len(stages)-1].inst, in)
		}
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if body, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// execForm parses a JSON-array instruction argument, ["a", "b"].
func execForm(args string) ([]string, bool) {
	var out []string
	if err := yaml.Unmarshal([]byte(args), &out); err != nil || !strings.HasPrefix(strings.TrimSpace(args), "[") {
		return nil, false
	}
	return out, true
}

// envInstructions reads ENV k=v pairs (the form the Dockerfile uses).
func envInstructions(st stage) map[string]string {
	env := map[string]string{}
	for _, in := range st.inst {
		if in.cmd != "ENV" {
			continue
		}
		for _, kv := range strings.Fields(in.args) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = strings.Trim(v, `"`)
			}
		}
	}
	return env
}

// entrypoint is the final stage's ENTRYPOINT, which the compose health
// checks call.
func entrypoint(f files) []string {
	st := parseDockerfile(f[dockerfile])
	if len(st) == 0 {
		return nil
	}
	for _, in := range st[len(st)-1].inst {
		if in.cmd == "ENTRYPOINT" {
			ep, _ := execForm(in.args)
			return ep
		}
	}
	return nil
}

func checkDockerfile(f files, s settings, p *problems) {
	stages := parseDockerfile(f[dockerfile])
	if len(stages) < 2 {
		p.add("Dockerfile: %d stages, want a multi-stage build (builder and final image)", len(stages))
		return
	}
	build, final := stages[0], stages[len(stages)-1]
	if !strings.HasPrefix(build.from, "golang:1.26") {
		p.add("Dockerfile: builder is FROM %q, want golang:1.26", build.from)
	}
	if build.name == "" {
		p.add("Dockerfile: the builder stage has no name for COPY --from")
	}
	cgoOff := envInstructions(build)["CGO_ENABLED"] == "0"
	var built bool
	for _, in := range build.inst {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		built = true
		if strings.Contains(in.args, "CGO_ENABLED=0") {
			cgoOff = true
		}
		for _, flag := range []string{"-trimpath", "-s", "-w"} {
			if !slices.Contains(strings.Fields(strings.NewReplacer(`"`, " ", "'", " ").Replace(in.args)), flag) {
				p.add("Dockerfile: go build lacks %s", flag)
			}
		}
	}
	if !built {
		p.add("Dockerfile: the builder stage runs no go build")
	}
	if !cgoOff {
		p.add("Dockerfile: the build does not set CGO_ENABLED=0, so the binary may need libc")
	}
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") && final.from != "scratch" {
		p.add("Dockerfile: final image is %q, want distroless/static or scratch", final.from)
	}

	var user string
	for _, in := range final.inst {
		if in.cmd == "USER" {
			user = in.args
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	switch n, err := strconv.Atoi(uid); {
	case user == "":
		p.add("Dockerfile: the final stage sets no USER")
	case err != nil:
		p.add("Dockerfile: USER %q is not numeric (Kubernetes runAsNonRoot cannot check a name)", user)
	case n == 0:
		p.add("Dockerfile: USER %s is root, want non-root", user)
	}

	ep := entrypoint(f)
	if len(ep) != 1 {
		p.add("Dockerfile: ENTRYPOINT %q, want the binary alone in exec form", ep)
	}
	var copied, dataOwned, volume bool
	var cmd []string
	var exposed []string
	for _, in := range final.inst {
		fields := strings.Fields(in.args)
		switch in.cmd {
		case "COPY":
			if len(fields) < 2 {
				p.add("Dockerfile: COPY %q copies nothing", in.args)
				continue
			}
			dst := fields[len(fields)-1]
			if len(ep) == 1 && dst == ep[0] && slices.Contains(fields, "--from="+build.name) {
				copied = true
			}
			if dst == "/data" && uid != "" && slices.ContainsFunc(fields, func(f string) bool { return strings.HasPrefix(f, "--chown="+uid) }) {
				dataOwned = true
			}
		case "VOLUME":
			volume = strings.Contains(in.args, "/data")
		case "CMD":
			cmd, _ = execForm(in.args)
		case "EXPOSE":
			exposed = append(exposed, fields...)
		}
	}
	if !copied {
		p.add("Dockerfile: the final stage does not copy the built binary to the ENTRYPOINT %q", ep)
	}
	if !volume || !dataOwned {
		p.add("Dockerfile: want VOLUME /data created with --chown=<USER>, so SQLite can write there")
	}
	if !slices.Equal(cmd, []string{"serve"}) {
		p.add("Dockerfile: CMD %q, want [\"serve\"]", cmd)
	}
	env := envInstructions(final)
	if host, _, _ := net.SplitHostPort(env["FN_LISTEN"]); host != "0.0.0.0" {
		p.add("Dockerfile: FN_LISTEN=%q, want 0.0.0.0:PORT (the default listens on loopback only)", env["FN_LISTEN"])
	}
	if port := s.listenPort(env); !slices.Contains(exposed, port) || !slices.Contains(exposed, "9090") {
		p.add("Dockerfile: EXPOSE %q, want the API port %s and the metrics port 9090", exposed, port)
	}
	if db := env["FN_DATABASE_URL"]; db != "" && !strings.HasPrefix(db, "sqlite:/data/") {
		p.add("Dockerfile: FN_DATABASE_URL=%q is outside the /data volume", db)
	}

	var ignored []string
	for line := range strings.Lines(f[dockerignore]) {
		if line = strings.TrimSpace(line); line != "" && line[0] != '#' {
			ignored = append(ignored, line)
		}
	}
	for _, want := range []string{".git", "data"} {
		if !slices.Contains(ignored, want) {
			p.add(".dockerignore: lacks %s (history and local data, which may hold an issuer key, stay out of the image)", want)
		}
	}
}
