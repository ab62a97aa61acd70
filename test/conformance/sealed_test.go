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
// command lines, each pair both ways. The listener registers its key and
// the sender seals to it from its own identity file: the listener prints
// the plaintext. The sender starts over with another identity: the
// listener prints that envelope with payload null and error key_changed
// and keeps it; started again with -trust laptop, it prints it opened,
// then the next one.
func TestSealed(t *testing.T) {
	for _, sender := range impls {
		for _, opener := range impls {
			t.Run(sender.name+" to "+opener.name, func(t *testing.T) {
				r := startRelay(t)
				dir := t.TempDir()
				phoneID, cursor := filepath.Join(dir, "phone.id"), filepath.Join(dir, "phone.cursor")
				l := opener.listen(t, r, "phone", cursor, "-open", "-identity", phoneID)
				waitFor(t, 20*time.Second, "phone's key in the directory", func() bool { return r.listedKey("phone") })
				plaintext := "sealed by " + sender.name + ", opened by " + opener.name
				send := func(identity, id, text string) {
					t.Helper()
					sender.send(t, r, "laptop", "-seal", "-identity", filepath.Join(dir, identity), "-to", "phone", "-id", id, text).answer(t, id)
				}
				send("laptop.id", "s-1", plaintext)
				send("laptop-new.id", "s-2", "from a new identity")
				l.waitPrinted(2, 20*time.Second)
				l.stop()
				p := l.printed()
				if len(p) != 2 || p[0].ID != "s-1" || p[0].From != "laptop" || p[0].Payload != b64(plaintext) || p[0].Error != "" {
					t.Fatalf("listen -open printed %+v, want %q first", p, plaintext)
				}
				if p[1].ID != "s-2" || p[1].Payload != "" || p[1].Error != "key_changed" {
					t.Fatalf("listen -open printed %+v for an envelope sealed by a changed key, want error key_changed", p[1])
				}

				// The cursor file goes on past s-2: a refused envelope is handled.
				if got := readCursor(cursor); got != p[1].Seq {
					t.Fatalf("cursor file holds %d after seq %d", got, p[1].Seq)
				}
				// Held back, s-2 opens once its sender's new key is trusted,
				// before what came since. Seen red when s-2 was gone.
				l = opener.listen(t, r, "phone", cursor, "-open", "-identity", phoneID, "-trust", "laptop", "-count", "2")
				send("laptop-new.id", "s-3", "trusted now")
				send("laptop-new.id", "s-4", "after")
				l.wait(0)
				if p := l.printed(); len(p) != 2 || p[0].ID != "s-2" || p[0].Payload != b64("from a new identity") || p[0].Error != "" || p[1].ID != "s-3" || p[1].Payload != b64("trusted now") {
					t.Fatalf("listen -open -trust laptop printed %+v, want s-2 opened, then s-3", p)
				}
			})
		}
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

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
