package deploy

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// selector is a metric a PromQL expression reads, with the label names its
// matchers use.
type selector struct {
	metric string
	labels []string
}

var (
	promString   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promVariable = regexp.MustCompile(`\$\{[^}]*\}|\$\w+`) // Grafana's
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promMatcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promToken    = regexp.MustCompile(`[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[a-zA-Z]*|[A-Za-z_:][A-Za-z0-9_:]*|\S`)
)

// promKeywords are PromQL's words that are not metric names and are not
// always followed by "(" (functions are, and are skipped by that).
var promKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
}

// labelLists are the keywords followed by a list of label names in
// parentheses.
var labelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promSelectors lists the metrics expr reads. It is a tokenizer, not a
// parser: after strings and Grafana variables are blanked, an identifier
// is a metric unless it is a keyword, a function (followed by "("), or a
// label name in a grouping list or a matcher.
func promSelectors(expr string) []selector {
	expr = promString.ReplaceAllString(expr, `""`)
	expr = promVariable.ReplaceAllString(expr, "1m")
	// Matchers, by position, then blanked so their label names are not
	// taken for metrics.
	type span struct {
		start, end int
		labels     []string
	}
	var spans []span
	for _, m := range promMatchers.FindAllStringIndex(expr, -1) {
		var labels []string
		for _, lm := range promMatcher.FindAllStringSubmatch(expr[m[0]:m[1]], -1) {
			labels = append(labels, lm[1])
		}
		spans = append(spans, span{m[0], m[1], labels})
	}
	blank := []byte(expr)
	for _, s := range spans {
		for i := s.start + 1; i < s.end-1; i++ {
			blank[i] = ' '
		}
	}
	expr = string(blank)

	var out []selector
	toks := promToken.FindAllStringIndex(expr, -1)
	for i := 0; i < len(toks); i++ {
		tok := expr[toks[i][0]:toks[i][1]]
		next := ""
		if i+1 < len(toks) {
			next = expr[toks[i+1][0]:toks[i+1][1]]
		}
		switch {
		case labelLists[tok] && next == "(":
			for i < len(toks) && expr[toks[i][0]:toks[i][1]] != ")" {
				i++
			}
			continue
		case promKeywords[tok], next == "(":
			continue
		case tok[0] == '_' || tok[0] == ':' || ('a' <= tok[0] && tok[0] <= 'z') || ('A' <= tok[0] && tok[0] <= 'Z'):
			sel := selector{metric: tok}
			if next == "{" {
				for _, s := range spans {
					if s.start == toks[i+1][0] {
						sel.labels = s.labels
					}
				}
			}
			out = append(out, sel)
		}
	}
	return out
}

func TestPromSelectors(t *testing.T) {
	cases := []struct {
		expr string
		want []string
	}{
		{`fn_held_polls`, []string{"fn_held_polls"}},
		{`sum by (job, le) (rate(fn_send_duration_seconds_bucket{instance=~"$instance", job="x}y"}[$__rate_interval]))`, []string{"fn_send_duration_seconds_bucket"}},
		{`histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0.1`, []string{"a_bucket"}},
		{`(a / (b > 0) > 0.9) and on (job, instance) c`, []string{"a", "b", "c"}},
		{`x - on (job) group_right sum by (job, instance) (rate(y[15m])) > 1e3`, []string{"x", "y"}},
		{`rate(z[5m] offset 1d) unless ignoring(reason) w{reason!="a"}`, []string{"z", "w"}},
		{`sum without (instance) (increase(fn_x_total{code=~"5.."}[1h]))`, []string{"fn_x_total"}},
	}
	for _, c := range cases {
		var got []string
		for _, s := range promSelectors(c.expr) {
			got = append(got, s.metric)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.expr, got, c.want)
		}
	}
	sel := promSelectors(`rate(fn_polls_total{outcome="error", job=~"a|b"}[5m])`)
	if len(sel) != 1 || strings.Join(sel[0].labels, ",") != "outcome,job" {
		t.Errorf("labels: %+v", sel)
	}
}
