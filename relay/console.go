package relay

import (
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/flamenet/relay/internal/console"
	"github.com/flamenet/relay/internal/pairing"
	"github.com/flamenet/relay/token"
)

// consoleRoutes serves the household console (Config.Console) under
// /console/: its files, and the QR code of an invitation's link. It is
// not part of the protocol (docs/openapi.yaml): a page of this relay's,
// for people.
func (s *Server) consoleRoutes(r chi.Router, p *pairing.Pairing) {
	notFound := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf(http.StatusNotFound, codeNotFound, "No such endpoint."))
	})
	files := http.StripPrefix("/console", console.Handler(notFound))
	r.Get("/console", func(w http.ResponseWriter, r *http.Request) {
		console.SetHeaders(w.Header())
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	r.Get("/console/*", files.ServeHTTP)
	r.Head("/console/*", files.ServeHTTP)
	r.Post("/console/qr", withConsoleHeaders(s.pairingOn(p, s.authed(consoleQR(p)))))
}

// pairPageRoutes serves the pairing page under /pair/, which an app
// device's invitation link opens: served whenever the relay pairs,
// console or not, as the links are made whenever it pairs. Like the
// console it is a page for people, not part of the protocol (the links'
// form is).
func (s *Server) pairPageRoutes(r chi.Router) {
	notFound := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errorf(http.StatusNotFound, codeNotFound, "No such endpoint."))
	})
	files := http.StripPrefix("/pair", console.PairPage(notFound))
	r.Get("/pair", func(w http.ResponseWriter, r *http.Request) {
		console.SetHeaders(w.Header())
		http.Redirect(w, r, "/pair/", http.StatusMovedPermanently)
	})
	r.Get("/pair/*", files.ServeHTTP)
	r.Head("/pair/*", files.ServeHTTP)
}

func withConsoleHeaders(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		console.SetHeaders(w.Header())
		h(w, r)
	}
}

// consoleQR answers the QR code, in SVG, of the pairing link of the code
// in the body (pairing.QRLink: admin tokens only; the console shows it
// beside the code).
func consoleQR(p *pairing.Pairing) func(http.ResponseWriter, *http.Request, *token.Claims) error {
	return func(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
		link, err := p.QRLink(w, r, c)
		if err != nil {
			return err
		}
		svg, err := console.QR(link)
		if err != nil {
			return err
		}
		h := w.Header()
		h.Set("Content-Type", "image/svg+xml")
		h.Set("Content-Length", strconv.Itoa(len(svg)))
		h.Set("Cache-Control", "no-store")
		setAnswerDeadline(w, r, int64(len(svg)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(svg)
		return nil
	}
}
