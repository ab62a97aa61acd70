package conformance

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestSealed: send -seal and listen -open across the implementations'
// command lines, each pair both ways: the listener registers its key,
// the sender seals to it from its own identity file, the listener prints
// the plaintext; the identity files are the same format in both.
func TestSealed(t *testing.T) {
	for _, sender := range impls {
		for _, opener := range impls {
			t.Run(sender.name+" to "+opener.name, func(t *testing.T) {
				r := startRelay(t)
				dir := t.TempDir()
				l := opener.listen(t, r, "phone", "", "-open", "-identity", filepath.Join(dir, "phone.id"))
				waitFor(t, 20*time.Second, "phone's key in the directory", func() bool { return r.listedKey("phone") })
				plaintext := "sealed by " + sender.name + ", opened by " + opener.name
				sender.send(t, r, "laptop", "-seal", "-identity", filepath.Join(dir, "laptop.id"), "-to", "phone", "-id", "s-1", plaintext).answer(t, "s-1")
				l.waitPrinted(1, 20*time.Second)
				l.stop()
				p := l.printed()
				if len(p) != 1 || p[0].ID != "s-1" || p[0].From != "laptop" || p[0].Payload != base64.StdEncoding.EncodeToString([]byte(plaintext)) {
					t.Fatalf("listen -open printed %+v, want %q", p, plaintext)
				}
			})
		}
	}
}

// listedKey says whether the directory lists an identity key for device.
func (r *relayProc) listedKey(device string) bool {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.url()+"/v1/devices", nil)
	req.Header.Set("Authorization", "Bearer "+r.token("laptop"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Devices []struct {
			Device      string  `json:"device"`
			IdentityKey *string `json:"identity_key"`
		} `json:"devices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		r.t.Fatalf("GET /v1/devices: %d, %v", resp.StatusCode, err)
	}
	for _, d := range out.Devices {
		if d.Device == device && d.IdentityKey != nil {
			return true
		}
	}
	return false
}
