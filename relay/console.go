package relay

import (
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/flamenet/relay/console"
	"github.com/flamenet/relay/token"
)

// consoleRoutes serves the household console (Config.Console) under
// /console/: its files, and the QR code of an invitation's link. It is
// not part of the protocol (docs/openapi.yaml): a page of this relay's,
// for people.
func (s *Server) consoleRoutes(r chi.Router) {
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
	r.Post("/console/qr", withConsoleHeaders(s.pairingOn(s.authed(s.consoleQR))))
}

func withConsoleHeaders(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		console.SetHeaders(w.Header())
		h(w, r)
	}
}

// qrRequest is POST /console/qr's body: an invitation's code, never in
// the URL, so that no access log or proxy log holds it.
type qrRequest struct {
	Code string `json:"code" msgpack:"code"`
}

// consoleQR answers the QR code, in SVG, of the pairing link of the code
// in the body (admin tokens only: the console shows it beside the code).
// The link is the one POST /v1/invitations answers; the code is not
// looked up, only read, and never logged.
func (s *Server) consoleQR(w http.ResponseWriter, r *http.Request, c *token.Claims) error {
	if err := requireAdmin(c, "ask for invitation QR codes"); err != nil {
		return err
	}
	body, err := readBody(w, r, pairBodyLimit)
	if err != nil {
		return err
	}
	var req qrRequest
	if err := decodeRequest(r, body, &req); err != nil {
		return err
	}
	code, ok := normalizeCode(req.Code)
	if !ok {
		return badRequest("code must be an invitation code (ABCDE-FGHJK).")
	}
	svg, err := console.QR(s.publicBase(r) + "/console/#pair=" + code[:codeLen/2] + "-" + code[codeLen/2:])
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
