package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type dashboardPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Datasource json.RawMessage `json:"datasource"`
		Expr       string          `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	SchemaVersion int              `json:"schemaVersion"`
	UID           string           `json:"uid"`
	Title         string           `json:"title"`
	Panels        []dashboardPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Datasource json.RawMessage `json:"datasource"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type dashboardQuery struct{ panel, expr string }

const dsInput = `{"type":"prometheus","uid":"${DS_PROMETHEUS}"}`

// loadDashboard parses the dashboard and checks that Grafana's import will
// ask for the Prometheus data source and that every query uses it.
func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("%s: __inputs %+v, want one Prometheus data source input DS_PROMETHEUS", dashboardFile, d.Inputs)
	}
	if d.SchemaVersion < 36 || d.UID == "" || d.Title == "" {
		t.Errorf("%s: schemaVersion %d, uid %q, title %q", dashboardFile, d.SchemaVersion, d.UID, d.Title)
	}
	for _, v := range d.Templating.List {
		if !sameJSON(v.Datasource, dsInput) {
			t.Errorf("%s: variable %s: data source %s, want %s", dashboardFile, v.Name, v.Datasource, dsInput)
		}
	}
	return d
}

func sameJSON(raw json.RawMessage, want string) bool {
	var a, b any
	return json.Unmarshal(raw, &a) == nil && json.Unmarshal([]byte(want), &b) == nil && equalJSON(a, b)
}

func equalJSON(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// dashboardQueries lists every panel's PromQL, its variables' queries
// included.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	d := loadDashboard(t)
	var qs []dashboardQuery
	ids := map[int]bool{}
	var walk func(ps []dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d twice", dashboardFile, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
			}
			if !sameJSON(p.Datasource, dsInput) {
				t.Errorf("%s: panel %q: data source %s, want %s", dashboardFile, p.Title, p.Datasource, dsInput)
			}
			for _, tg := range p.Targets {
				if !sameJSON(tg.Datasource, dsInput) || tg.Expr == "" {
					t.Errorf("%s: panel %q: a query without expr or with data source %s", dashboardFile, p.Title, tg.Datasource)
				}
				qs = append(qs, dashboardQuery{p.Title, tg.Expr})
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		// label_values(metric{...}, label): the metric is the first argument.
		qs = append(qs, dashboardQuery{"variable " + v.Name, labelValuesMetric(v.Definition)})
	}
	return qs
}

// labelValuesMetric is the selector of a label_values(selector, label)
// variable query.
func labelValuesMetric(def string) string {
	const prefix = "label_values("
	if len(def) <= len(prefix) || def[:len(prefix)] != prefix {
		return def
	}
	inner := def[len(prefix) : len(def)-1]
	depth := 0
	for i, c := range inner {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				return inner[:i]
			}
		}
	}
	return inner
}

// TestDashboardShape runs without a relay: the file parses, asks for its
// data source on import and has queries.
func TestDashboardShape(t *testing.T) {
	if qs := dashboardQueries(t); len(qs) < 20 {
		t.Fatalf("%d queries", len(qs))
	}
}

// TestDashboardQueriesParse gives every panel's query, with Grafana's
// variables as an import would fill them, to Prometheus' own parser
// (promtool check rules, each query a recording rule), so that a query
// Grafana would show as an error fails here.
func TestDashboardQueriesParse(t *testing.T) {
	promtool := tool(t, "promtool", "prometheus")
	fill := strings.NewReplacer("$__rate_interval", "1m", "$job", "relay", "$instance", ".*", "$__all", ".*")
	var rules []map[string]string
	for i, q := range dashboardQueries(t) {
		if strings.HasPrefix(q.panel, "variable ") {
			continue // label_values(...) is Grafana's, not PromQL; its selector is checked below
		}
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", i), "expr": fill.Replace(q.expr)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard.rules.yaml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's %d queries: %v\n%s", len(rules), err, out)
	}
}
