import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { MemoryCursorStore, NoAnswerError, RelayClient, RelayError } from "../index.js";
import type { Envelope } from "../index.js";
import { FaultyProxy, eventually, household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

interface Call {
  url: string;
  method: string;
  body: string | undefined;
}

/** A fetch that records each request before making it for real. */
function recording(): { calls: Call[]; fetch: typeof fetch } {
  const calls: Call[] = [];
  return {
    calls,
    fetch: (input, init) => {
      calls.push({ url: String(input), method: init?.method ?? "GET", body: typeof init?.body === "string" ? init.body : undefined });
      return fetch(input, init);
    },
  };
}

const text = (b: Uint8Array) => new TextDecoder().decode(b);

let relay: Relay;
before(async () => {
  relay = await startRelay();
});
after(async () => {
  await relay?.stop();
});

async function device(hh: string, name: string, opts: Partial<ConstructorParameters<typeof RelayClient>[0]> = {}, url = relay.url) {
  return new RelayClient({ url, token: await relay.token(hh, name), ...opts });
}

describe("single calls", () => {
  test("register, send, poll and ack", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    const laptop = await device(hh, "laptop");
    const reg = await phone.register();
    assert.match(reg.epoch, /^[A-Za-z0-9_-]{16}$/);
    assert.deepEqual(reg, { household: hh, device: "phone", cursor: 0, epoch: reg.epoch });
    const sent = await laptop.send(["phone"], "hello");
    assert.equal(sent.deliveries.length, 1);
    assert.deepEqual(sent.deliveries[0], { device: "phone", seq: 1 });
    const bytes = new Uint8Array([0, 255, 128, 10]);
    await laptop.send(["phone"], bytes, { id: "bin-1" });

    const res = await phone.poll({ cursor: 0, epoch: reg.epoch });
    assert.equal(res.epoch, reg.epoch);
    assert.equal(res.more, false);
    assert.equal(res.cursor, 2);
    assert.deepEqual(res.envelopes.map((e) => [e.seq, e.id, e.from]), [[1, sent.id, "laptop"], [2, "bin-1", "laptop"]]);
    assert.equal(text(res.envelopes[0]!.payload), "hello");
    assert.deepEqual([...res.envelopes[1]!.payload], [...bytes]);
    assert.match(res.envelopes[0]!.sent_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);

    await phone.ack(2, { epoch: res.epoch });
    const again = await phone.poll({ cursor: 2, epoch: res.epoch });
    assert.deepEqual(again, { cursor: 2, more: false, envelopes: [], epoch: reg.epoch });
  });

  test("refusals are typed errors, and send does not retry them", async () => {
    const hh = household();
    const rec = recording();
    const phone = await device(hh, "phone");
    await phone.register();
    const laptop = await device(hh, "laptop", { fetch: rec.fetch });

    const refused = async (call: () => Promise<unknown>, status: number, code: string) => {
      const before = rec.calls.length;
      const err = await call().then(
        () => assert.fail(`want ${status} ${code}`),
        (e: unknown) => e,
      );
      assert.ok(err instanceof RelayError, String(err));
      assert.equal(err.status, status);
      assert.equal(err.code, code);
      assert.equal(rec.calls.length - before, 1, `${status} ${code} was retried`);
      return err;
    };
    await refused(() => laptop.send(["ghost"], "x"), 404, "unknown_device");
    await refused(() => laptop.send([], "x"), 400, "bad_request");
    await refused(() => laptop.send(["phone"], new Uint8Array(65537)), 413, "payload_too_large");
    await laptop.send(["phone"], "one", { id: "same" });
    await refused(() => laptop.send(["phone"], "two", { id: "same" }), 409, "id_conflict");
    const ahead = await refused(() => laptop.poll({ cursor: 99 }), 409, "cursor_ahead");
    assert.equal(ahead.head, 0);
    assert.ok(ahead.cursorAhead);
    await refused(() => laptop.ack(99), 409, "cursor_ahead");
    // An epoch that is not the store's: 409 with the current one.
    const stale = await refused(() => laptop.ack(0, { epoch: "AAAAAAAAAAAAAAAA" }), 409, "cursor_ahead");
    assert.match(stale.epoch ?? "", /^[A-Za-z0-9_-]{16}$/);
    await refused(() => laptop.poll({ cursor: 0, epoch: "not an epoch" }), 400, "bad_request");

    const stranger = new RelayClient({ url: relay.url, token: "not.a.token", fetch: rec.fetch });
    await refused(() => stranger.send(["phone"], "x"), 401, "unauthorized");
    await refused(() => stranger.poll(), 401, "unauthorized");
  });

  test("a 429 carries its limit and Retry-After", async () => {
    const tight = await startRelay({ FN_SEND_BURST: "1", FN_SEND_RATE: "0.001" });
    try {
      const hh = household();
      const phone = new RelayClient({ url: tight.url, token: await tight.token(hh, "phone") });
      await phone.register();
      await phone.sendOnce(["phone"], "a", "a");
      const err = await phone.sendOnce(["phone"], "b", "b").catch((e: unknown) => e);
      assert.ok(err instanceof RelayError, String(err));
      assert.equal(err.status, 429);
      assert.equal(err.code, "rate_limited");
      assert.equal(err.limit, "send_rate");
      assert.ok(err.retryAfter !== undefined && err.retryAfter >= 1 && err.retryAfter <= 4, `Retry-After ${err.retryAfter}`);
      assert.ok(err.temporary);
    } finally {
      await tight.stop();
    }
  });
});

describe("send retries", () => {
  test("a 429 with the same id and body, after Retry-After", async () => {
    const tight = await startRelay({ FN_SEND_BURST: "1", FN_SEND_RATE: "1" });
    try {
      const hh = household();
      const rec = recording();
      const phone = new RelayClient({ url: tight.url, token: await tight.token(hh, "phone"), fetch: rec.fetch });
      await phone.register();
      await phone.send(["phone"], "first");
      const start = Date.now();
      const res = await phone.send(["phone"], "second", { signal: AbortSignal.timeout(30_000) });
      const sends = rec.calls.filter((c) => c.url.endsWith("/v1/send")).slice(1);
      assert.ok(sends.length >= 2, `want a refused attempt and a retry, got ${sends.length} attempts`);
      assert.ok(sends.every((c) => c.body === sends[0]!.body), "attempts differ");
      assert.equal(JSON.parse(sends[0]!.body!).id, res.id);
      assert.ok(Date.now() - start >= 1000, "retried before Retry-After");
      assert.deepEqual(res.deliveries, [{ device: "phone", seq: 2 }]);
    } finally {
      await tight.stop();
    }
  });

  test("a lost answer with the same id: the relay answers the first answer and stores once", async () => {
    const proxy = await FaultyProxy.start(relay.url);
    try {
      const hh = household();
      const phone = await device(hh, "phone");
      await phone.register();
      const rec = recording();
      const laptop = await device(hh, "laptop", { fetch: rec.fetch }, proxy.url);
      proxy.loseNextAnswer();
      const res = await laptop.send(["phone"], "once", { signal: AbortSignal.timeout(30_000) });
      assert.equal(rec.calls.length, 2, "want one lost attempt and one retry");
      assert.equal(rec.calls[0]!.body, rec.calls[1]!.body);
      assert.deepEqual(res.deliveries, [{ device: "phone", seq: 1 }]);
      const got = await phone.poll({ cursor: 0 });
      assert.deepEqual(got.envelopes.map((e) => text(e.payload)), ["once"]);
    } finally {
      await proxy.close();
    }
  });

  test("gives up when its signal aborts, with the last attempt's error", async () => {
    const proxy = await FaultyProxy.start(relay.url);
    try {
      proxy.refuseNext(1000);
      const laptop = await device(household(), "laptop", {}, proxy.url);
      const start = Date.now();
      const err = await laptop.send(["phone"], "x", { signal: AbortSignal.timeout(1500) }).catch((e: unknown) => e);
      assert.ok(err instanceof Error && /gave up/.test(err.message), String(err));
      assert.ok((err as Error).cause instanceof NoAnswerError, String((err as Error).cause));
      assert.ok(Date.now() - start < 5000, "did not stop at the signal");
      assert.ok(proxy.connections >= 1);
    } finally {
      await proxy.close();
    }
  });
});

describe("listen", () => {
  test("polling (streams: false), hands over every envelope once, in seq order, each poll carrying the cursor", async () => {
    const hh = household();
    const rec = recording();
    const phone = await device(hh, "phone", { fetch: rec.fetch });
    const laptop = await device(hh, "laptop");
    await phone.register();
    for (let i = 1; i <= 5; i++) await laptop.send(["phone"], `m${i}`);

    const store = new MemoryCursorStore();
    const got: Envelope[] = [];
    const stop = new AbortController();
    await phone.listen(
      async (e) => {
        got.push(e);
        // The cursor is saved after the handler, before the next envelope.
        assert.equal(store.cursor, e.seq - 1);
        if (got.length === 5) stop.abort();
      },
      { cursorStore: store, signal: stop.signal, wait: 5, limit: 2, streams: false },
    );
    assert.deepEqual(got.map((e) => [e.seq, text(e.payload)]), [[1, "m1"], [2, "m2"], [3, "m3"], [4, "m4"], [5, "m5"]]);
    assert.equal(store.cursor, 5);
    const polls = rec.calls.filter((c) => c.url.includes("/v1/poll")).map((c) => new URL(c.url).searchParams.get("cursor"));
    // more: true after 2 and 4, so the next poll follows at once with the new cursor.
    assert.deepEqual(polls, ["0", "2", "4"]);

    // Started again with the same store: only what is new.
    await laptop.send(["phone"], "m6");
    const next: number[] = [];
    const stop2 = new AbortController();
    await phone.listen(
      (e) => {
        next.push(e.seq);
        stop2.abort();
      },
      { cursorStore: store, signal: stop2.signal, wait: 5 },
    );
    assert.deepEqual(next, [6]);
    assert.equal(store.cursor, 6);
  });

  test("a held poll answers the moment a send commits", async () => {
    const hh = household();
    const rec = recording();
    const phone = await device(hh, "phone", { fetch: rec.fetch });
    const laptop = await device(hh, "laptop");
    await phone.register();
    const stop = new AbortController();
    const got: string[] = [];
    const done = phone.listen(
      (e) => {
        got.push(text(e.payload));
        stop.abort();
      },
      { signal: stop.signal, wait: 30 },
    );
    await eventually("a held poll", () => rec.calls.length === 1);
    const start = Date.now();
    await laptop.send(["phone"], "wake");
    await done;
    assert.deepEqual(got, ["wake"]);
    assert.ok(Date.now() - start < 5000, "the held poll was not woken");
  });

  test("two listeners of one device do not spin superseding each other", async () => {
    const hh = household();
    const rec = recording();
    const laptop = await device(hh, "laptop");
    const stop = new AbortController();
    let handled = 0;
    const listeners = [0, 1].map(async () => {
      const phone = await device(hh, "phone", { fetch: rec.fetch });
      return phone.listen(() => void handled++, { signal: stop.signal, wait: 20 });
    });
    await eventually("the phone registered by its first poll", () => rec.calls.length >= 1);
    await new Promise((r) => setTimeout(r, 3000));
    await laptop.send(["phone"], "x");
    await eventually("an envelope handled", () => handled > 0);
    stop.abort();
    await Promise.all(listeners);
    const polls = rec.calls.filter((c) => new URL(c.url).pathname === "/v1/poll").length;
    assert.ok(polls <= 20, `two listeners of one device made ${polls} polls in about 3 s: they spin`);
  });

  test("recovers from cursor_ahead by polling once without the cursor, losing nothing", async () => {
    const hh = household();
    const rec = recording();
    const phone = await device(hh, "phone", { fetch: rec.fetch, log: () => {} });
    const laptop = await device(hh, "laptop");
    await phone.register();
    await laptop.send(["phone"], "a");
    await laptop.send(["phone"], "b");
    rec.calls.length = 0;

    // The saved cursor is above the device's head (2), as after a restore.
    const store = new MemoryCursorStore(50);
    const got: number[] = [];
    const stop = new AbortController();
    await phone.listen(
      (e) => {
        got.push(e.seq);
        if (got.length === 2) stop.abort();
      },
      { cursorStore: store, signal: stop.signal, wait: 5 },
    );
    assert.deepEqual(got, [1, 2]);
    assert.equal(store.cursor, 2);
    const cursors = rec.calls.map((c) => new URL(c.url).searchParams.get("cursor"));
    assert.deepEqual(cursors, ["50", null]);

    // Nothing waiting: the recovering answer's cursor is where the relay
    // stands. (listen's acknowledgement of 2 would ride on its next poll.)
    await phone.ack(2);
    rec.calls.length = 0;
    store.cursor = 70;
    const stop2 = new AbortController();
    const done = phone.listen(() => assert.fail("nothing is waiting"), { cursorStore: store, signal: stop2.signal, wait: 30 });
    await eventually("the poll after the recovery", () => rec.calls.length === 3);
    assert.equal(store.cursor, 2);
    assert.deepEqual(rec.calls.map((c) => new URL(c.url).searchParams.get("cursor")), ["70", null, "2"]);
    stop2.abort();
    await done;
  });

  test("stops cleanly on abort while a poll is held", async () => {
    const rec = recording();
    const phone = await device(household(), "phone", { fetch: rec.fetch });
    const stop = new AbortController();
    const done = phone.listen(() => assert.fail("nothing was sent"), { signal: stop.signal, wait: 30 });
    await eventually("a held poll", () => rec.calls.length === 1);
    const start = Date.now();
    stop.abort();
    await done;
    assert.ok(Date.now() - start < 2000, "listen did not stop at once");
  });

  test("polls again with the same cursor after no answer", async () => {
    const proxy = await FaultyProxy.start(relay.url);
    try {
      const hh = household();
      const rec = recording();
      const phone = await device(hh, "phone", { fetch: rec.fetch, log: () => {} }, proxy.url);
      const laptop = await device(hh, "laptop");
      await new RelayClient({ url: relay.url, token: await relay.token(hh, "phone") }).register();
      await laptop.send(["phone"], "through");
      proxy.refuseNext(2);
      const stop = new AbortController();
      const got: string[] = [];
      await phone.listen(
        (e) => {
          got.push(text(e.payload));
          stop.abort();
        },
        { cursorStore: new MemoryCursorStore(), signal: stop.signal, wait: 5 },
      );
      assert.deepEqual(got, ["through"]);
      assert.deepEqual(rec.calls.map((c) => new URL(c.url).searchParams.get("cursor")), ["0", "0", "0"]);
    } finally {
      await proxy.close();
    }
  });

  test("a handler that throws stops listen below its envelope", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    const laptop = await device(hh, "laptop");
    await phone.register();
    await laptop.send(["phone"], "ok");
    await laptop.send(["phone"], "bad");
    const store = new MemoryCursorStore();
    const err = await phone
      .listen(
        (e) => {
          if (text(e.payload) === "bad") throw new Error("cannot");
        },
        { cursorStore: store, wait: 1 },
      )
      .catch((e: unknown) => e);
    assert.match(String(err), /handler at seq 2: Error: cannot/);
    assert.equal(store.cursor, 1);
  });

  test("a refused token stops listen with the RelayError", async () => {
    const stranger = new RelayClient({ url: relay.url, token: "not.a.token" });
    const err = await stranger.listen(() => {}, { wait: 1 }).catch((e: unknown) => e);
    assert.ok(err instanceof RelayError && err.status === 401, String(err));
  });
});
