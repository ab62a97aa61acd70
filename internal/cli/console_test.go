//go:build linux

package cli

import (
	"bytes"
	"encoding/json"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	qrcode "github.com/skip2/go-qrcode"

	"github.com/flamenet/relay/internal/console"
	"github.com/flamenet/relay/internal/servicetest"
)

// consoleShots is where go test ./internal/cli -run TestConsole -update writes the
// console's screenshots, which the README shows.
const consoleShots = "docs/console"

// TestConsole drives the household console in headless Chromium through
// its whole story, on a relay (SQLite, FN_CONSOLE=true) over a real
// socket, with the real command line beside it: relay invite makes an
// admin code, the page pairs the browser with it, invites a phone and
// shows its code, expiry and QR code; relay pair pairs the phone with
// the code read off the page, a laptop sends to it and it listens; the
// page lists it, seen just now, with the fingerprint relay pair printed,
// and removes it after a confirmation, after which the relay lists it no
// more. The page logs no error (a policy violation would be one), keeps
// no token or code in its address, and the relay's log holds neither
// code. The first screen, before any invitation, shows no invitation
// panel. With -update the screenshots are written to docs/console/;
// otherwise they are only checked to be whole PNGs.
func TestConsole(t *testing.T) {
	b := servicetest.Chromium(t, 1000, 600)
	p, base, keyFile := startPairing(t, map[string]string{"FN_CONSOLE": "true", "FN_LOG_LEVEL": "debug"})
	dir := filepath.Dir(keyFile) // its directory, the test's own
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(relayBin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("relay %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	shot := func(name string) {
		t.Helper()
		screenshot(t, b, 1000, name)
	}
	codeRE := regexp.MustCompile(`(?m)^  code: +(\S+)\n  link: +(\S+)$`)

	// The admin's invitation for the browser, from the command line.
	m := codeRE.FindStringSubmatch(cli("invite", "-household", "home", "-device", "browser", "-scope", "admin", "-url", base, "-issuer-key-file", keyFile))
	if m == nil {
		t.Fatal("relay invite printed no code and link")
	}
	adminCode, adminLink := m[1], m[2]
	if adminLink != base+"/console/#pair="+adminCode+"&household=home&scope=admin" {
		t.Errorf("the admin's link: %s", adminLink)
	}

	// A fragment that does not decode is no link: the page starts.
	b.Navigate(base + "/console/#%E0")
	b.WaitFor("the pairing form, after a fragment that does not decode", `!document.getElementById("pair").hidden && document.getElementById("notice").hidden`)
	// The command the page asks for names the page's own relay: off the
	// default address, relay invite would ask another.
	var command string
	b.Eval(`document.getElementById("pair-command").textContent`, &command)
	if want := "relay invite -url " + base + " -household home -device browser -scope admin"; command != want {
		t.Errorf("the page asks for %q, want %q", command, want)
	}

	// The link's code pairs only once the household it names is confirmed.
	// (The same page: only a reload reads a new fragment.)
	b.Navigate(adminLink)
	// Page.reload, not location.reload() in an evaluation, whose answer
	// the reload can cut off.
	b.Call("Page.reload", nil, nil)
	b.WaitFor("the pairing form with the link's code and household", `!document.getElementById("pair-link").hidden &&
		document.getElementById("pair-household").textContent === "home" && document.getElementById("code").value === `+js(adminCode))
	shot("pair")
	b.Eval(`document.getElementById("pair-form").requestSubmit()`, nil)
	b.WaitFor("the confirmation naming the household", `document.getElementById("confirm-pair").open && document.getElementById("confirm-pair-household").textContent === "home"`)
	var before any
	b.Eval(`localStorage.getItem("relay-console")`, &before)
	if before != nil {
		t.Fatalf("the browser paired before the household was confirmed: %v", before)
	}
	b.Eval(`document.getElementById("confirm-pair-ok").click()`, nil)
	b.WaitFor("the household's devices", `document.querySelector('#device-rows tr[data-device="browser"]')`)
	// The first screen, before any invitation: no invitation panel, and
	// no pending invitation listed (the browser's was redeemed). Seen red
	// when .invitation's display: flex beat its hidden attribute and an
	// empty panel with a broken QR image showed.
	var first struct {
		Display string
		Pending int
	}
	b.Eval(`({display: getComputedStyle(document.getElementById("invitation")).display,
		pending: document.querySelectorAll("#pending-rows tr[data-device]").length})`, &first)
	if first.Display != "none" || first.Pending != 0 {
		t.Errorf("the first screen shows an invitation panel (display %q) or pending invitations (%d)", first.Display, first.Pending)
	}
	shot("first")
	var stored struct{ Household, Device, Scope, URL string }
	b.Eval(`JSON.parse(localStorage.getItem("relay-console"))`, &stored)
	if stored.Household != "home" || stored.Device != "browser" || stored.Scope != "admin" || stored.URL != base {
		t.Errorf("the browser's stored credentials: %+v", stored)
	}

	// The page invites the phone; its code is read off the page.
	b.Eval(`document.getElementById("invite-device").value = "phone"; document.getElementById("invite-form").requestSubmit()`, nil)
	b.WaitFor("the invitation and its QR code", `document.getElementById("inv-code").textContent && document.getElementById("qr").complete && document.getElementById("qr").naturalWidth > 0`)
	var inv struct {
		Code, Expires, Command, Link string
		QR                           int
	}
	b.Eval(`({code: document.getElementById("inv-code").textContent, expires: document.getElementById("inv-expires").textContent,
		command: document.getElementById("inv-command").textContent, link: document.getElementById("inv-link").textContent,
		qr: document.getElementById("qr").naturalWidth})`, &inv)
	if !regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{5}-[0-9A-HJKMNP-TV-Z]{5}$`).MatchString(inv.Code) || inv.Link != base+"/pair/#code="+inv.Code+"&household=home" ||
		!regexp.MustCompile(`\(in (9|10) minutes\)$`).MatchString(inv.Expires) ||
		inv.Command != "relay pair -url "+base+" -code "+inv.Code+" -store phone.json" {
		t.Fatalf("the invitation on the page: %+v", inv)
	}
	q, err := qrcode.New(inv.Link, qrcode.Medium)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(q.Bitmap()) * console.ModulePixels; inv.QR != want {
		t.Errorf("the QR code is %d pixels wide, the link's is %d", inv.QR, want)
	}
	b.WaitFor("the phone's invitation listed as pending", `document.querySelector('#pending-rows tr[data-device="phone"]')`)
	shot("invite")

	// The phone pairs with the command line, and a laptop sends to it.
	paired := cli("pair", "-url", base, "-code", inv.Code, "-store", filepath.Join(dir, "phone.json"), "-identity", filepath.Join(dir, "phone.key"))
	fp := regexp.MustCompile(`(?m)^fingerprint: (.+)$`).FindStringSubmatch(paired)
	if fp == nil {
		t.Fatalf("relay pair printed no fingerprint:\n%s", paired)
	}
	laptop := strings.TrimSpace(cli("token", "-issuer-key-file", keyFile, "-household", "home", "-device", "laptop"))
	cli("send", "-url", base, "-token", laptop, "-to", "phone", "hello, phone")
	if got := cli("listen", "-store", filepath.Join(dir, "phone.json"), "-count", "1"); !strings.Contains(got, `"payload":"aGVsbG8sIHBob25l"`) {
		t.Errorf("the phone received %s", got)
	}

	// A tablet's invitation, cancelled from the list: its code no longer
	// pairs, and the invitation shown goes (hidden wins over its flex).
	b.Eval(`document.getElementById("invite-device").value = "tablet"; document.getElementById("invite-form").requestSubmit()`, nil)
	b.WaitFor("the tablet's invitation, pending", `document.getElementById("inv-code").textContent !== `+js(inv.Code)+` &&
		document.querySelector('#pending-rows tr[data-device="tablet"]')`)
	var tabletCode string
	b.Eval(`document.getElementById("inv-code").textContent`, &tabletCode)
	b.Eval(`document.querySelector('#pending-rows tr[data-device="tablet"] button').click()`, nil)
	b.WaitFor("the tablet's invitation cancelled and hidden", `!document.querySelector('#pending-rows tr[data-device="tablet"]') &&
		getComputedStyle(document.getElementById("invitation")).display === "none"`)
	if status, body := request(t, "POST", base+"/v1/pair", "", `{"code":"`+tabletCode+`"}`); status != http.StatusUnauthorized {
		t.Errorf("pairing with a cancelled code: %d %s", status, body)
	}

	b.Eval(`document.getElementById("refresh").click()`, nil)
	b.WaitFor("the phone, seen just now, with its fingerprint", `(() => {
		const r = document.querySelector('#device-rows tr[data-device="phone"]');
		return r && r.querySelector(".seen").textContent === "just now" && r.querySelector(".fingerprint").textContent === `+js(fp[1])+`;
	})()`)
	shot("devices")

	// Removed after a confirmation.
	b.Eval(`document.querySelector('#device-rows tr[data-device="phone"] button.remove').click()`, nil)
	b.WaitFor("the confirmation", `document.getElementById("confirm").open`)
	var listed bool
	b.Eval(`!!document.querySelector('#device-rows tr[data-device="phone"]')`, &listed)
	if !listed {
		t.Fatal("the phone went before the removal was confirmed")
	}
	shot("remove")
	b.Eval(`document.getElementById("confirm-remove").click()`, nil)
	b.WaitFor("the phone gone", `!document.querySelector('#device-rows tr[data-device="phone"]') && document.querySelector('#device-rows tr[data-device="browser"]')`)
	status, body := request(t, "GET", base+"/v1/devices", laptop, "")
	if status != http.StatusOK || bytes.Contains(body, []byte(`"phone"`)) || !bytes.Contains(body, []byte(`"browser"`)) {
		t.Errorf("the relay's directory after the removal: %d %s", status, body)
	}

	var href string
	b.Eval(`location.href`, &href)
	if href != base+"/console/" {
		t.Errorf("the page's address is %s", href)
	}
	if errs := b.Errors(); len(errs) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	logs := p.logs()
	for _, c := range []string{adminCode, inv.Code, strings.ReplaceAll(inv.Code, "-", ""), tabletCode} {
		if strings.Contains(logs, c) {
			t.Errorf("the relay's log holds the code %s", c)
		}
	}
	for _, route := range []string{"route=/console/*", "route=/console/qr", "route=/v1/invitations", "route=/v1/pair"} {
		if !strings.Contains(logs, route+" ") {
			t.Errorf("no access line with %s:\n%s", route, logs)
		}
	}
}

// screenshot checks that the page's screenshot, at width and the page's
// height, is a whole PNG, and with -update writes it to
// docs/console/NAME.png.
func screenshot(t *testing.T, b *servicetest.Browser, width int, name string) {
	t.Helper()
	var height int
	b.Eval(`document.documentElement.scrollHeight`, &height)
	b.Resize(width, max(height, 480))
	shot := b.Screenshot()
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() != width {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if *update {
		if err := os.MkdirAll(consoleShots, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(consoleShots, name+".png"), shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// js is s as a JavaScript string.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// visiblePairButtons counts the buttons labelled Pair that a person can
// see (a hidden section's and a closed dialog's have no offsetParent).
const visiblePairButtons = `[...document.querySelectorAll("button")].filter((b) => b.offsetParent !== null && b.textContent.trim() === "Pair").length`

// consoleRelay runs the relay with the console on SQLite and returns it,
// its base URL and an admin token of household home.
func consoleRelay(t *testing.T) (*process, string, string) {
	t.Helper()
	p, base, keyFile := startPairing(t, map[string]string{"FN_CONSOLE": "true"})
	cmd := exec.Command(relayBin, "token", "-issuer-key-file", keyFile, "-household", "home", "-device", "admin", "-scope", "admin")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("relay token: %v", err)
	}
	return p, base, strings.TrimSpace(string(out))
}

type invitation struct{ Code, URL string }

// invite asks the relay for an invitation (POST /v1/invitations, body as
// given) with the admin token.
func invite(t *testing.T, base, admin, body string) invitation {
	t.Helper()
	status, b := request(t, "POST", base+"/v1/invitations", admin, body)
	var inv invitation
	if status != http.StatusCreated || json.Unmarshal(b, &inv) != nil || inv.Code == "" {
		t.Fatalf("invitation %s: %d %s", body, status, b)
	}
	return inv
}

// pending is the household's pending invitations by device, with their
// scopes, as GET /v1/invitations lists them.
func pending(t *testing.T, base, admin string) map[string]string {
	t.Helper()
	status, b := request(t, "GET", base+"/v1/invitations", admin, "")
	var out struct {
		Invitations []struct {
			Device, Scope string
			RedeemedAt    *string `json:"redeemed_at"`
		}
	}
	if status != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Fatalf("GET /v1/invitations: %d %s", status, b)
	}
	m := map[string]string{}
	for _, in := range out.Invitations {
		if in.RedeemedAt == nil {
			m[in.Device] = in.Scope
		}
	}
	return m
}

// TestConsoleAppLink: an app device's invitation never pairs a browser.
// Its link opens the pairing page, which shows the code and household in
// large type, hands both to the app by the flamenet-relay scheme and
// offers no pairing; the console, opened with the same code in its own
// link's form but without scope=admin (as every link was before links
// said their scope), shows the code for the app and no Pair button.
// After both, the invitation is still pending: the browser spent nothing
// and holds no credentials. With -update the pairing page's screenshot
// is written to docs/console/app.png.
func TestConsoleAppLink(t *testing.T) {
	b := servicetest.Chromium(t, 420, 600)
	_, base, admin := consoleRelay(t)
	inv := invite(t, base, admin, `{"device":"phone"}`)
	if inv.URL != base+"/pair/#code="+inv.Code+"&household=home" {
		t.Errorf("an app device's link: %s", inv.URL)
	}

	b.Navigate(inv.URL)
	var pairs int
	b.Eval(visiblePairButtons, &pairs)
	if pairs != 0 {
		t.Fatalf("the app device's link shows %d Pair buttons", pairs)
	}
	b.WaitFor("the pairing page, with the code and household", `document.getElementById("code") && document.getElementById("code").textContent === `+js(inv.Code)+` &&
		document.getElementById("household").textContent === "home"`)
	var page struct{ Open, Href, Command string }
	b.Eval(`({open: document.getElementById("open").href, href: location.href, command: document.getElementById("command").textContent})`, &page)
	if want := "flamenet-relay://pair?relay=" + url.QueryEscape(base) + "&code=" + inv.Code + "&household=home"; page.Open != want {
		t.Errorf("open in the app: %q, want %q", page.Open, want)
	}
	if page.Href != base+"/pair/" || page.Command != "relay pair -url "+base+" -code "+inv.Code+" -store device.json" {
		t.Errorf("the page: %+v", page)
	}
	screenshot(t, b, 420, "app")
	b.Eval(`document.getElementById("copy").click()`, nil)
	b.WaitFor("the copy's answer", `!document.getElementById("copied").hidden`)

	// The console, with the code in its link's form and no admin scope.
	b.Resize(1000, 600)
	b.Navigate(base + "/console/#pair=" + inv.Code + "&household=home")
	b.WaitFor("the console started", `document.readyState === "complete" && (!document.getElementById("pair").hidden ||
		(document.getElementById("app-link") && !document.getElementById("app-link").hidden))`)
	b.Eval(visiblePairButtons, &pairs)
	if pairs != 0 {
		t.Errorf("the console opened with an app device's code shows %d Pair buttons", pairs)
	}
	b.WaitFor("the code shown for the app", `!document.getElementById("app-link").hidden && document.getElementById("app-code").textContent === `+js(inv.Code)+` &&
		document.getElementById("app-household").textContent === "home" && !document.getElementById("app-pair-admin").hidden`)
	var code string
	b.Eval(`document.getElementById("code").value`, &code)
	if code != "" {
		t.Errorf("the pairing form holds the app's code %q", code)
	}

	time.Sleep(500 * time.Millisecond) // anything the page would send, sent
	if got := pending(t, base, admin); got["phone"] != "device" {
		t.Errorf("the phone's invitation is no longer pending: %v", got)
	}
	var stored any
	b.Eval(`localStorage.getItem("relay-console")`, &stored)
	if stored != nil {
		t.Errorf("the browser paired: %v", stored)
	}
	if status, body := request(t, "GET", base+"/v1/devices", admin, ""); status != http.StatusOK || bytes.Contains(body, []byte(`"phone"`)) {
		t.Errorf("the devices: %d %s", status, body)
	}

	// The app's code typed into the console's Pair form: refused, and
	// still the phone's (the console pairs only an admin's code).
	b.Navigate(base + "/console/")
	b.WaitFor("the pairing form", `document.readyState === "complete" && !document.getElementById("pair").hidden`)
	b.Eval(`document.getElementById("code").value = `+js(inv.Code)+`; document.getElementById("pair-submit").click()`, nil)
	b.WaitFor("the refusal", `document.getElementById("pair-error").textContent.includes("an app device's code")`)
	if got := pending(t, base, admin); got["phone"] != "device" {
		t.Errorf("the phone's invitation, typed into the console, was spent: %v", got)
	}
	b.Eval(`localStorage.getItem("relay-console")`, &stored)
	if stored != nil {
		t.Errorf("the browser paired with a typed app code: %v", stored)
	}
	// The refusal's 401 is the one error expected.
	var errs []string
	for _, e := range b.Errors() {
		if !strings.Contains(e, "status of 401") || !strings.HasSuffix(e, "/v1/pair)") {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		t.Errorf("the pages logged errors:\n%s", strings.Join(errs, "\n"))
	}
}

// TestConsolePendingInvitations: the console lists the household's
// pending invitations, those made elsewhere (here through the API) too,
// with their scope and expiry, and cancels one with its Cancel button:
// the relay lists it no more, and the other is still pending.
func TestConsolePendingInvitations(t *testing.T) {
	b := servicetest.Chromium(t, 1000, 600)
	_, base, admin := consoleRelay(t)
	browser := invite(t, base, admin, `{"device":"browser","scope":"admin"}`)
	invite(t, base, admin, `{"device":"tablet"}`)
	invite(t, base, admin, `{"device":"laptop","scope":"admin"}`)

	b.Navigate(browser.URL)
	b.WaitFor("the pairing form with the link's code", `document.getElementById("code").value === `+js(browser.Code))
	b.Eval(`document.getElementById("pair-form").requestSubmit()`, nil)
	b.WaitFor("the confirmation", `document.getElementById("confirm-pair").open`)
	b.Eval(`document.getElementById("confirm-pair-ok").click()`, nil)
	b.WaitFor("both invitations listed", `document.querySelector('#pending-rows tr[data-device="tablet"]') && document.querySelector('#pending-rows tr[data-device="laptop"]')`)
	var rows [][]string
	b.Eval(`[...document.querySelectorAll("#pending-rows tr")].map((r) => [r.dataset.device, ...[...r.cells].map((c) => c.textContent)])`, &rows)
	expires := regexp.MustCompile(`\(in (9|10) minutes\)$`)
	if len(rows) != 2 {
		t.Fatalf("pending rows: %q", rows)
	}
	for _, r := range rows {
		want := map[string]string{"tablet": "device", "laptop": "admin"}[r[0]]
		if len(r) < 4 || r[1] != r[0] || r[2] != want || !expires.MatchString(r[3]) {
			t.Errorf("the row of %s: %q (want its scope %s and expiry)", r[0], r, want)
		}
	}

	b.Eval(`document.querySelector('#pending-rows tr[data-device="tablet"] button').click()`, nil)
	b.WaitFor("the tablet's invitation gone, the laptop's listed", `!document.querySelector('#pending-rows tr[data-device="tablet"]') &&
		document.querySelector('#pending-rows tr[data-device="laptop"]')`)
	if got := pending(t, base, admin); len(got) != 1 || got["laptop"] != "admin" {
		t.Errorf("pending after the cancel: %v, want only the laptop's", got)
	}

	// An invitation made on the page and redeemed elsewhere: once the
	// page hears it is no longer pending, its code is no longer shown.
	b.Eval(`document.getElementById("invite-device").value = "phone"; document.getElementById("invite-form").requestSubmit()`, nil)
	b.WaitFor("the phone's invitation shown", `document.getElementById("inv-code").textContent !== "" &&
		getComputedStyle(document.getElementById("invitation")).display !== "none"`)
	var code string
	b.Eval(`document.getElementById("inv-code").textContent`, &code)
	if status, body := request(t, "POST", base+"/v1/pair", "", `{"code":"`+code+`"}`); status != http.StatusOK {
		t.Fatalf("the phone's pairing: %d %s", status, body)
	}
	b.Eval(`document.getElementById("refresh").click()`, nil)
	b.WaitFor("the redeemed invitation no longer shown", `document.querySelector('#device-rows tr[data-device="phone"]') &&
		getComputedStyle(document.getElementById("invitation")).display === "none"`)
	if errs := b.Errors(); len(errs) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(errs, "\n"))
	}
}
