package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/flamenet/relay/internal/config"
)

// probe runs a health check that needs nothing but this binary, for
// container images that have no shell or curl.
func probe(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flags("probe", "[URL]", "GETs the URL (default http://127.0.0.1:8080/ready) and exits 0 when it answers 200.", stdout)
	if _, err := config.Parse(fs, args, nil, noEnv); err != nil {
		return err
	}
	target := "http://127.0.0.1:8080/ready"
	switch fs.NArg() {
	case 0:
	case 1:
		target = fs.Arg(0)
	default:
		return usageErr("probe: unexpected argument %q", fs.Arg(1))
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe: %s answered %s", target, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
