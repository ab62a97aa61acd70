package push

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"time"
)

// maxResponse bounds how much of a provider's answer is read.
const maxResponse = 64 << 10

// newTransport is the base of every provider's client: TLS with the given
// roots (nil: the system's), HTTP/2 when the server offers it.
func newTransport(roots *x509.CertPool) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// newClient never follows redirects: a provider that redirects is answering
// wrongly, and a UnifiedPush endpoint must not steer the relay elsewhere.
func newClient(tr *http.Transport) *http.Client {
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// readBody reads at most maxResponse bytes of a response and closes it, so
// the connection can be reused.
func readBody(resp *http.Response) []byte {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponse))
	resp.Body.Close()
	return b
}
