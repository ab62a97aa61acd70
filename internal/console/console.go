// Package console is the household console: a page served by the relay
// (FN_CONSOLE) on which an admin device pairs the browser, sees the
// household's devices, removes one and invites another, and the pairing
// page that an app device's invitation link opens (PairPage). Their files
// are built from web/ and the TypeScript client into assets/, which are
// committed and embedded, so that running the relay needs no build step
// (build_test.go holds them to a fresh build).
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var embedded embed.FS

// Assets is the console's files, index.html at the root.
var Assets, _ = fs.Sub(embedded, "assets")

// Policy is the Content-Security-Policy of every console answer: scripts,
// styles and fetches from the relay's origin only, no inline script or
// style, images from the origin or made by the page (the QR code), no
// framing, no form posts, and DOM sinks that take strings closed
// (Trusted Types).
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

// SetHeaders sets the console's security headers on h: the policy, no
// framing, no referrer (the pairing link carries its code in the fragment,
// which browsers never send; the referrer must not carry the page either),
// no content sniffing, a browsing context of its own, and no caching of
// answers that carry codes.
func SetHeaders(h http.Header) {
	h.Set("Content-Security-Policy", Policy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=(), usb=()")
}

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

type file struct {
	body        []byte
	contentType string
	etag        string
}

var files = func() map[string]file {
	out := map[string]file{}
	_ = fs.WalkDir(Assets, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Assets, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		out[p] = file{body: b, contentType: contentTypes[path.Ext(p)], etag: `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	return out
}()

// Handler serves the console's files at the paths below its mount point
// ("/" is index.html), GET and HEAD, with SetHeaders' headers; a path
// that is not a file goes to notFound (with the same headers). The
// pairing page's files (PairPage) are not the console's.
func Handler(notFound http.Handler) http.Handler {
	return serve(notFound, func(name string) string {
		if strings.HasPrefix(name, pairDir) {
			return ""
		}
		return name
	})
}

// pairDir holds the pairing page's files in assets/.
const pairDir = "pair/"

// PairPage serves the pairing page, which an app device's invitation
// link opens (docs/PROTOCOL.md, "Pairing"), as Handler serves the
// console: its files are assets/pair/, "/" its index.html, and the
// console's icon. The page shows the code in the link's fragment and
// hands it to the app; it never calls the relay, so it cannot spend the
// code, and needs no console (FN_CONSOLE) to be served.
func PairPage(notFound http.Handler) http.Handler {
	return serve(notFound, func(name string) string {
		if name == "favicon.svg" {
			return name
		}
		return pairDir + name
	})
}

// serve serves the file that asset names for the request's path below
// the mount point ("" when none).
func serve(notFound http.Handler, asset func(name string) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SetHeaders(w.Header())
		name := strings.TrimPrefix(r.URL.Path, "/")
		if name == "" || strings.HasSuffix(name, "/") {
			name += "index.html"
		}
		name = asset(name)
		f, ok := files[name]
		if name == "" || !ok || f.contentType == "" {
			notFound.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", f.contentType)
		// Revalidated on each load, so that a new relay's files are used
		// at once; the ETag makes that a 304.
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("ETag", f.etag)
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
	})
}
