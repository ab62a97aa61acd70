package redis_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flamenet/relay/device"
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
