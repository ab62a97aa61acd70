package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/flamenet/relay/client"
)

// A laptop sends "hello" to the phone of its household. The id is picked
// once per send: the retries inside Send reuse it, so the relay stores the
// envelope once however often the answer is lost.
func ExampleClient_Send() {
	ctx := context.Background()
	phone, _ := client.New(relayURL, tokenFor("example-send", "phone"))
	if _, err := phone.Register(ctx); err != nil { // a recipient must exist
		log.Fatal(err)
	}

	laptop, err := client.New(relayURL, tokenFor("example-send", "laptop"))
	if err != nil {
		log.Fatal(err)
	}
	res, err := laptop.Send(ctx, client.NewID(), []string{"phone"}, []byte("hello"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Deliveries[0].Device, res.Deliveries[0].Seq)
	// Output: phone 1
}

// The phone listens: each envelope is handed over once, in seq order, and
// the cursor is saved in a file after each, so a phone that restarts goes
// on where it stopped. Here it stops itself after two envelopes.
func ExampleClient_Listen() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	phone, _ := client.New(relayURL, tokenFor("example-listen", "phone"), client.WithWait(20))
	phone.Register(ctx)
	laptop, _ := client.New(relayURL, tokenFor("example-listen", "laptop"))
	for _, text := range []string{"first", "second"} {
		if _, err := laptop.Send(ctx, client.NewID(), []string{"phone"}, []byte(text)); err != nil {
			log.Fatal(err)
		}
	}

	cursor := client.FileCursor(filepath.Join(dir, "phone.cursor"))
	handled := 0
	err := phone.Listen(ctx, cursor, func(ctx context.Context, e client.Envelope) error {
		fmt.Printf("%d %s from %s\n", e.Seq, e.Payload, e.From)
		if handled++; handled == 2 {
			stop()
		}
		return nil
	})
	saved, _ := cursor.Load(context.Background())
	fmt.Println("stopped:", err, "cursor:", saved.Cursor)
	// Output:
	// 1 first from laptop
	// 2 second from laptop
	// stopped: <nil> cursor: 2
}

// One poll, without holding, and its acknowledgement. Errors are *Error,
// with the relay's status and code.
func ExampleClient_Poll() {
	ctx := context.Background()
	phone, _ := client.New(relayURL, tokenFor("example-poll", "phone"), client.WithCodec(client.MessagePack))
	res, err := phone.Poll(ctx, client.PollQuery{Cursor: 0, Wait: 0})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("envelopes:", len(res.Envelopes), "cursor:", res.Cursor)

	var e *client.Error
	// An acknowledgement carries the epoch its cursor was taken in.
	err = phone.Ack(ctx, client.Position{Cursor: 5, Epoch: res.Epoch})
	if errors.As(err, &e) {
		fmt.Println(e.Status, e.Code, "head:", e.Head)
	}
	// Output:
	// envelopes: 0 cursor: 0
	// 409 cursor_ahead head: 0
}
