package redis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
	"github.com/flamenet/relay/wake"
	wredis "github.com/flamenet/relay/wake/redis"
)

// A device whose polls move from relay A to relay B is woken on B for a
// send on A committed after B's Subscribe returned (the poll's first read
// comes after it): B's subscription is confirmed before Subscribe returns.
// B's session is held just before it sends the subscription, so that a
// Subscribe that returned early would let the send through unheard.
//
// Guard: Subscribe waits for the confirmation. Broken on purpose once
// (hold returning before its wait), this went red: "Wait on B = context
// deadline exceeded: the send after B's first read was not heard".
func TestMovedDeviceWokenAfterFirstRead(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	k := dev(1)

	// The device polls on A first, then moves.
	wa := subscribe(t, a.hub, k)
	wa.Close()

	entered := make(chan struct{})
	release := make(chan struct{})
	waiting := make(chan struct{}, 1)
	var once sync.Once
	wredis.SetHooks(b.hub, func() {
		once.Do(func() {
			close(entered)
			<-release
		})
	}, func(device.Key) { waiting <- struct{}{} })

	subscribed := make(chan error, 1)
	var wb interface{ Close() }
	got := make(chan error, 1)
	go func() {
		w, err := b.hub.Subscribe(context.Background(), k)
		if err != nil {
			subscribed <- err
			return
		}
		wb = w
		// The poll's first read would be here; a send after it follows.
		serr := a.hub.Signal(context.Background(), wakes(5, k))
		subscribed <- serr
		got <- waitFor(w, 3*time.Second)
	}()
	<-entered
	select {
	case <-waiting: // Subscribe waits for the subscription it asked for
	case err := <-subscribed: // it did not: A has sent already
		if err != nil {
			t.Fatalf("Subscribe or Signal: %v", err)
		}
		subscribed <- nil
	}
	close(release)
	if err := <-subscribed; err != nil {
		t.Fatalf("Subscribe or Signal: %v", err)
	}
	t.Cleanup(func() { wb.Close() })
	if err := <-got; err != nil {
		t.Fatalf("Wait on B = %v: the send after B's first read was not heard", err)
	}
	if h := b.obs.head(k); h != 5 {
		t.Fatalf("B's observer has head %d, want 5 (woken by the message)", h)
	}
}

// A device that polls again within the linger costs Redis nothing: no
// SUBSCRIBE after the first. Past the linger the relay leaves the channel,
// stops hearing the device, and Hears turns false.
func TestSubscriptionLingers(t *testing.T) {
	raw, prefix := sharedRedis(t)
	cfg := steady(prefix)
	cfg.Linger = 300 * time.Millisecond
	a := newProcess(t, raw, 4, cfg)
	b := newProcess(t, raw, 4, cfg)
	k := dev(1)
	if b.hub.Hears(k) {
		t.Fatal("Hears before any poll")
	}
	for i := range 5 {
		w := subscribe(t, b.hub, k)
		if !b.hub.Hears(k) {
			t.Fatalf("poll %d: Hears false once Subscribe returned", i)
		}
		w.Close()
	}
	if n := b.counter(t, "fn_redis_device_subscription_commands_total", "subscribe"); n != 1 {
		t.Fatalf("%v SUBSCRIBE commands for 5 polls within the linger, want 1", n)
	}
	if n := b.obs.forgotten(k); n != 1 {
		t.Fatalf("observer told to forget k %d times, want 1 (at the confirmation)", n)
	}
	eventually(t, 5*time.Second, "B leaves k's channel", func() bool {
		return b.counter(t, "fn_redis_device_subscriptions") == 0
	})
	if b.hub.Hears(k) {
		t.Fatal("Hears after the subscription ended")
	}
	if n := b.counter(t, "fn_redis_device_subscription_changes_total", "unsubscribe"); n != 1 {
		t.Fatalf("%v channels left, want 1", n)
	}
	// What B no longer listens for it does not hear: a wake of k, then one
	// of a device B holds, on one subscriber connection in order.
	k2 := dev(2)
	defer subscribe(t, b.hub, k2).Close()
	if err := a.hub.Signal(context.Background(), append(wakes(9, k), wakes(9, k2)...)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "B hears k2", func() bool { return b.obs.head(k2) == 9 })
	if h := b.obs.head(k); h == 9 {
		t.Fatal("B heard a device it left")
	}
	if n := b.counter(t, "fn_redis_wakeups_received_total"); n != 1 {
		t.Fatalf("B received %v wakes, want 1", n)
	}
}

// One poll per device in the fleet: a device's poll on B ends its older
// poll on A as superseded, and A leaves the device's channel at once, not
// after the linger; when the device comes back to A, B's poll ends.
//
// Guard: the older poll is ended. Broken on purpose once (heldElsewhere
// not ending the local waiter), this went red: "A's poll: Wait did not
// return within 2s".
func TestPresenceSupersedesAcrossRelays(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	k := dev(1)

	wa := subscribe(t, a.hub, k)
	gotA := waitAsync(context.Background(), wa)
	wb := subscribe(t, b.hub, k)
	gotB := waitAsync(context.Background(), wb)
	if err := receive(t, gotA, 2*time.Second, "A's poll"); !errors.Is(err, wake.ErrSuperseded) {
		t.Fatalf("A's poll = %v, want ErrSuperseded", err)
	}
	wa.Close()
	eventually(t, 2*time.Second, "A leaves the channel", func() bool {
		return a.counter(t, "fn_redis_device_subscriptions") == 0
	})
	if n := a.counter(t, "fn_redis_devices_moved_away_total"); n != 1 {
		t.Fatalf("A counted %v devices moved away, want 1", n)
	}
	// B's poll is the device's: a send on A wakes it.
	if err := a.hub.Signal(context.Background(), wakes(3, k)); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, gotB, 2*time.Second, "B's poll"); err != nil {
		t.Fatalf("B's poll = %v, want woken", err)
	}

	// Back to A.
	gotB = waitAsync(context.Background(), wb)
	defer subscribe(t, a.hub, k).Close()
	if err := receive(t, gotB, 2*time.Second, "B's poll"); !errors.Is(err, wake.ErrSuperseded) {
		t.Fatalf("B's poll = %v, want ErrSuperseded", err)
	}
}

// A presence older than this relay's own poll of the device (the device
// came back before the news of its stay elsewhere arrived) does not end
// the poll: the relay announces its own instead. Broken on purpose once
// (every presence obeyed), this went red: "no presence from A in answer".
func TestStalePresenceAnsweredNotObeyed(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	k := dev(1)
	w := subscribe(t, a.hub, k)

	listener := adminClient(t, raw)
	ps := listener.Subscribe(context.Background(), a.hub.DeviceChannel(k))
	defer ps.Close()
	if _, err := ps.Receive(context.Background()); err != nil { // the confirmation
		t.Fatal(err)
	}
	stale := time.Now().Add(-time.Minute).UnixNano()
	if err := listener.Publish(context.Background(), a.hub.DeviceChannel(k), wredis.PresencePayload([8]byte{9}, k, stale)).Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for {
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("no presence from A in answer: %v", err)
		}
		if msg.Payload[0] == 'P' && msg.Payload[1] != 9 {
			break // A's own
		}
	}
	if err := w.(interface{ Err() error }).Err(); err != nil {
		t.Fatalf("A's poll ended (%v) on a presence older than it", err)
	}
	if n := a.counter(t, "fn_redis_devices_moved_away_total"); n != 0 {
		t.Fatalf("A counted %v devices moved away, want 0", n)
	}
}

// pushes records a hub's pushes.
type pushes struct {
	mu  sync.Mutex
	got map[device.Key]int
}

func (p *pushes) Push(k device.Key, _ device.PushTarget) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.got == nil {
		p.got = map[device.Key]int{}
	}
	p.got[k]++
}

func (p *pushes) count(k device.Key) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[k]
}

// A device is pushed by one relay, and only when no relay holds it: held
// on B, a send on A pushes nothing; held nowhere and heard nowhere, A
// pushes; its poll on B just ended (B still listens), B pushes and A does
// not. Broken on purpose once each, this went red: with A pushing every
// device it does not hold itself, "a device held on B: pushed 1 times by
// A"; with B never pushing for A, "B pushes the device it no longer
// holds: not within 2s".
func TestPushOnlyWhereNotHeld(t *testing.T) {
	raw, prefix := sharedRedis(t)
	a := newProcess(t, raw, 4, steady(prefix))
	b := newProcess(t, raw, 4, steady(prefix))
	var pa, pb pushes
	a.hub.PushVia(&pa)
	b.hub.PushVia(&pb)
	target := device.PushTarget{Kind: device.PushUnifiedPush, Address: "https://push.example/x"}
	signal := func(k device.Key, head int64) {
		t.Helper()
		ws := wakes(head, k)
		ws[0].Push = target
		if err := a.hub.Signal(context.Background(), ws); err != nil {
			t.Fatal(err)
		}
	}

	held := dev(1)
	w := subscribe(t, b.hub, held)
	got := waitAsync(context.Background(), w)
	signal(held, 1)
	if err := receive(t, got, 2*time.Second, "B's poll"); err != nil {
		t.Fatal(err)
	}
	nowhere := dev(2)
	signal(nowhere, 1)
	if pa.count(nowhere) != 1 {
		t.Fatalf("a device held nowhere: A pushed %d times, want 1", pa.count(nowhere))
	}
	// B has heard the held device's wake (its poll woke) and A decided
	// before Signal returned: neither pushed it.
	if pa.count(held) != 0 || pb.count(held) != 0 {
		t.Fatalf("a device held on B: pushed %d times by A and %d by B, want none", pa.count(held), pb.count(held))
	}

	w.Close() // B still listens for the linger
	signal(held, 2)
	eventually(t, 2*time.Second, "B pushes the device it no longer holds", func() bool { return pb.count(held) == 1 })
	if pa.count(held) != 0 || pb.count(nowhere) != 0 {
		t.Fatalf("A pushed the device B listens for %d times, B the unheard one %d times; want none", pa.count(held), pb.count(nowhere))
	}
}
