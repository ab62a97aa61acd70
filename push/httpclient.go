package push

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxResponse bounds how much of a provider's answer is read. A longer
// answer is not a complete one and fails the push.
const maxResponse = 64 << 10

// newTransport is the base of every provider's client: TLS with the given
// roots (nil: the system's), HTTP/2 when the server offers it, and at most
// headerTimeout between writing a request and reading the answer's headers.
func newTransport(roots *x509.CertPool, headerTimeout time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: headerTimeout,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// caller makes a provider's HTTP exchanges. It never follows redirects: a
// provider that redirects is answering wrongly, and a UnifiedPush endpoint
// must not steer the relay elsewhere.
type caller struct {
	transport *http.Transport
	client    *http.Client
	attempt   time.Duration // bound on one whole exchange
}

func newCaller(tr *http.Transport, attempt time.Duration) *caller {
	return &caller{
		transport: tr,
		client: &http.Client{
			Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		attempt: attempt,
	}
}

// answer is a provider's whole answer to one request.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request and reads the whole (bounded) answer, all within
// the attempt bound: connecting, writing, waiting for the headers and
// reading the body. A body that trickles in is cut off there, and an answer
// not read to its end is an error, never a success. The error names no URL,
// since a UnifiedPush URL is the device's capability and an APNs URL holds
// its token.
func (c *caller) call(ctx context.Context, method, rawURL string, body []byte, header http.Header) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.attempt)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, rawURL, bytes.NewReader(body))
	if err != nil {
		return answer{}, stripURL(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return answer{}, stripURL(err)
	}
	b, err := readBody(resp)
	if err != nil {
		return answer{}, fmt.Errorf("answer with status %d: %w", resp.StatusCode, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func (c *caller) close() { c.transport.CloseIdleConnections() }

// readBody reads the whole body, at most maxResponse bytes, and closes it.
// Read to its end, the connection can be reused.
func readBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", stripURL(err))
	}
	if len(b) > maxResponse {
		return nil, fmt.Errorf("answer longer than %d bytes", maxResponse)
	}
	return b, nil
}

// stripURL replaces a *url.Error, whose message quotes the request's URL,
// by its operation and cause. The cause stays in the chain for errors.Is.
func stripURL(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	return fmt.Errorf("%s: %w", strings.ToLower(ue.Op), stripURL(ue.Err))
}
