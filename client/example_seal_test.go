package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/flamenet/relay/client"
	"github.com/flamenet/relay/seal"
)

// The laptop seals "hello" to the phone; the phone opens it. Each device
// keeps its identity in a seed file and the keys it pinned in a keyring
// file; a key that changes in the directory is reported, never used.
// docs/E2E.md shows this body; TestE2EDocExample keeps the two equal.
func ExampleSealer() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "example-e2e")
	defer os.RemoveAll(dir)

	open := func(device string) *client.Sealer {
		id, _, err := seal.LoadOrCreateIdentity(filepath.Join(dir, device+".id"))
		if err != nil {
			log.Fatal(err)
		}
		ring, err := seal.OpenKeyring(ctx, seal.FileStore(filepath.Join(dir, device+".pins")),
			seal.OnKeyChange(func(c seal.KeyChange) { log.Print(c) })) // ask the user to compare fingerprints
		if err != nil {
			log.Fatal(err)
		}
		c, _ := client.New(relayURL, tokenFor("example-e2e", device))
		s, err := c.NewSealer(ctx, id, ring) // registers the identity key
		if err != nil {
			log.Fatal(err)
		}
		return s
	}
	phone, laptop := open("phone"), open("laptop")

	if _, err := laptop.SendSealed(ctx, client.NewID(), []string{"phone"}, []byte("hello")); err != nil {
		log.Fatal(err) // seal.ErrKeyChanged: the phone's key is not the one pinned
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	phone.ListenSealed(ctx, &client.MemoryCursor{}, &client.MemoryHeld{}, func(ctx context.Context, e client.Envelope, plaintext []byte, err error) error {
		fmt.Printf("%s from %s, error: %v\n", plaintext, e.From, err)
		stop()
		return nil
	})
	// Output: hello from laptop, error: <nil>
}
