package console

import (
	"bytes"
	"fmt"

	qrcode "github.com/skip2/go-qrcode"
)

// ModulePixels is the size of one module of QR's codes, in pixels, when
// shown at their own size.
const ModulePixels = 4

// QR returns text as a QR code (error correction M, with its quiet zone) in
// SVG: one path of unit squares on a white square, scaled by whoever
// shows it.
func QR(text string) ([]byte, error) {
	q, err := qrcode.New(text, qrcode.Medium)
	if err != nil {
		return nil, fmt.Errorf("qr: %w", err)
	}
	bits := q.Bitmap()
	n := len(bits)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" shape-rendering="crispEdges">`, n*ModulePixels, n*ModulePixels, n, n)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/><path fill="#000" d="`, n, n)
	for y, row := range bits {
		for x, dark := range row {
			if dark {
				fmt.Fprintf(&b, "M%d %dh1v1h-1z", x, y)
			}
		}
	}
	b.WriteString(`"/></svg>`)
	return b.Bytes(), nil
}
