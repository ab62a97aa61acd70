package migrate

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	file := func(sql string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(sql)} }
	ms, err := Load(fstest.MapFS{
		"m/0010_later.sql": file("B"),
		"m/0002_first.sql": file("A"),
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0] != (Migration{2, "0002_first.sql", "A"}) || ms[1] != (Migration{10, "0010_later.sql", "B"}) {
		t.Fatalf("Load = %+v, want 0002 then 0010", ms)
	}
	for name, tc := range map[string]struct {
		files fstest.MapFS
		want  string
	}{
		"no number":    {fstest.MapFS{"m/first.sql": file("")}, "want NNNN_name.sql"},
		"not sql":      {fstest.MapFS{"m/0001_first.txt": file("")}, "want NNNN_name.sql"},
		"zero":         {fstest.MapFS{"m/0000_first.sql": file("")}, "bad version"},
		"not a number": {fstest.MapFS{"m/x1_first.sql": file("")}, "bad version"},
		"shared":       {fstest.MapFS{"m/0001_a.sql": file(""), "m/01_b.sql": file("")}, "share version 1"},
		"empty":        {fstest.MapFS{"m/.keep": nil}, "want NNNN_name.sql"},
		"none":         {fstest.MapFS{"m": &fstest.MapFile{Mode: fs.ModeDir}}, "no migrations"},
		"no directory": {fstest.MapFS{"other/0001_a.sql": file("")}, "read migrations"},
	} {
		if _, err := Load(tc.files, "m"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Load error %v, want one saying %q", name, err, tc.want)
		}
	}
}

func TestApplyInOrderStopsAtError(t *testing.T) {
	ms := []Migration{{Version: 1}, {Version: 2}, {Version: 3}}
	var seen []int
	boom := errors.New("boom")
	err := Apply(context.Background(), ms, slog.New(slog.DiscardHandler), func(_ context.Context, m Migration) (bool, error) {
		seen = append(seen, m.Version)
		if m.Version == 2 {
			return false, boom
		}
		return true, nil
	})
	if !errors.Is(err, boom) || len(seen) != 2 || seen[0] != 1 || seen[1] != 2 {
		t.Fatalf("Apply = %v after %v, want boom after 1, 2", err, seen)
	}
}
