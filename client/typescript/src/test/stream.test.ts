import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import { after, before, describe, test } from "node:test";

import { MemoryCursorStore, RelayClient, RelayError, StreamUnavailableError } from "../index.js";
import type { ConnectionState } from "../index.js";
import { FaultyProxy, eventually, household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

/** A fetch that records each request's path and cursor before making it. */
function recording(): { paths: string[]; fetch: typeof fetch } {
  const paths: string[] = [];
  return {
    paths,
    fetch: (input, init) => {
      const u = new URL(String(input));
      paths.push(`${init?.method ?? "GET"} ${u.pathname}${u.search}`);
      return fetch(input, init);
    },
  };
}

/**
 * An HTTP proxy that passes each answer on only once it is whole, as a
 * proxy with answer buffering on does: a stream's events never arrive.
 */
async function bufferingProxy(target: string): Promise<{ url: string; close: () => Promise<void> }> {
  const server: Server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const headers = new Headers();
    for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string" && k !== "host" && k !== "connection") headers.set(k, v);
    try {
      const up = await fetch(target + req.url, { method: req.method!, headers, ...(chunks.length > 0 && { body: Buffer.concat(chunks) }) });
      const body = Buffer.from(await up.arrayBuffer());
      const out: Record<string, string> = {};
      up.headers.forEach((v, k) => {
        if (k !== "content-length" && k !== "transfer-encoding" && k !== "connection") out[k] = v;
      });
      res.writeHead(up.status, out).end(body);
    } catch {
      res.destroy();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address();
  if (addr === null || typeof addr === "string") throw new Error("proxy: no address");
  return {
    url: `http://127.0.0.1:${addr.port}`,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
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

/** Listens until want envelopes came, sending sends[i] with send(i) as soon as the listener is ready for the next. */
async function listenFor(phone: RelayClient, want: number, opts: { store?: MemoryCursorStore; streamReadyTimeoutMs?: number } = {}) {
  const got: string[] = [];
  const stop = new AbortController();
  const done = phone.listen(
    (e) => {
      got.push(`${e.seq}:${text(e.payload)}`);
      if (got.length === want) stop.abort();
    },
    { signal: stop.signal, wait: 20, cursorStore: opts.store ?? new MemoryCursorStore(), ...(opts.streamReadyTimeoutMs !== undefined && { streamReadyTimeoutMs: opts.streamReadyTimeoutMs }) },
  );
  return { got, done, stop };
}

const expected = (n: number, from = 1) => Array.from({ length: n }, (_, i) => `${from + i}:m${from + i}`);

describe("streams", () => {
  test("listen streams by default: one request, every envelope once and in order, the position kept", async () => {
    const hh = household();
    const rec = recording();
    const states: ConnectionState[] = [];
    const phone = await device(hh, "phone", { fetch: rec.fetch, onState: (s) => states.push(s) });
    const laptop = await device(hh, "laptop");
    await phone.register();
    states.length = 0;
    for (let i = 1; i <= 3; i++) await laptop.send(["phone"], `m${i}`);
    const store = new MemoryCursorStore();
    const l = await listenFor(phone, 8, { store });
    await eventually("the first three", () => l.got.length === 3);
    for (let i = 4; i <= 8; i++) await laptop.send(["phone"], `m${i}`);
    await l.done;
    assert.deepEqual(l.got, expected(8));
    assert.equal(store.cursor, 8);
    const listened = rec.paths.filter((p) => !p.startsWith("POST /v1/ack") && !p.startsWith("POST /v1/register"));
    assert.deepEqual(listened.slice(1), [], `listen made more than one request: ${listened.join(", ")}`);
    assert.match(listened[0]!, /^GET \/v1\/stream\?cursor=0/);
    assert.deepEqual(
      states.map((s) => s.kind + ("transport" in s ? `/${s.transport}` : "")),
      ["connecting/stream", "connected/stream", "stopped"],
    );
  });

  test("the next stream's cursor acknowledges: what was handed over is not handed over again", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    const laptop = await device(hh, "laptop");
    await phone.register();
    const store = new MemoryCursorStore();
    for (let i = 1; i <= 2; i++) await laptop.send(["phone"], `m${i}`);
    const first = await listenFor(phone, 2, { store });
    await first.done;
    await laptop.send(["phone"], "m3");
    const second = await listenFor(phone, 1, { store });
    await second.done;
    assert.deepEqual([...first.got, ...second.got], expected(3));
    // The relay holds nothing at or below 3 now.
    const res = await phone.poll({ cursor: 3, wait: 0 });
    assert.deepEqual(res.envelopes, []);
  });

  test("stream() refuses a cursor above the device's head with 409 cursor_ahead, before any event", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    await phone.register();
    const err = await phone.stream({ cursor: 99 }).catch((e: unknown) => e);
    assert.ok(err instanceof RelayError && err.status === 409 && err.cursorAhead, String(err));
  });

  test("a stream cut by a proxy mid-answer resumes from its cursor: nothing lost, repeated or reordered", async () => {
    const proxy = await FaultyProxy.start(relay.url);
    try {
      const hh = household();
      const rec = recording();
      const phone = await device(hh, "phone", { fetch: rec.fetch, log: () => {}, maxBackoffMs: 50 }, proxy.url);
      const laptop = await device(hh, "laptop");
      await phone.register();
      proxy.cutAfter("event: envelopes", 3);
      const l = await listenFor(phone, 12);
      for (let i = 1; i <= 12; i++) {
        await laptop.send(["phone"], `m${i}`);
        await eventually(`m${i}`, () => l.got.length >= i || l.got.length === 12);
      }
      await l.done;
      assert.deepEqual(l.got, expected(12));
      const streams = rec.paths.filter((p) => p.startsWith("GET /v1/stream")).length;
      assert.ok(streams >= 4, `${streams} streams for 3 cuts`);
      assert.equal(rec.paths.filter((p) => p.startsWith("GET /v1/poll")).length, 0, "a cut stream is not a reason to poll");
    } finally {
      await proxy.close();
    }
  });

  test("behind a proxy that buffers answers, listen finds no stream and polls: nothing lost", async () => {
    const proxy = await bufferingProxy(relay.url);
    try {
      const hh = household();
      const rec = recording();
      const states: ConnectionState[] = [];
      const phone = await device(hh, "phone", { fetch: rec.fetch, log: () => {}, onState: (s) => states.push(s) }, proxy.url);
      const laptop = await device(hh, "laptop");
      await phone.register();
      for (let i = 1; i <= 2; i++) await laptop.send(["phone"], `m${i}`);
      const l = await listenFor(phone, 2, { streamReadyTimeoutMs: 300 });
      await l.done;
      assert.deepEqual(l.got, expected(2));
      assert.match(rec.paths[1]!, /^GET \/v1\/stream/);
      assert.ok(rec.paths.some((p) => p.startsWith("GET /v1/poll")), `no poll after the stream failed: ${rec.paths.join(", ")}`);
      const kinds = states.map((s) => s.kind + ("transport" in s ? `/${s.transport}` : ""));
      assert.ok(kinds.includes("connecting/stream") && kinds.includes("waiting/poll"), kinds.join(", "));
    } finally {
      await proxy.close();
    }
  });

  test("a relay that serves no stream (404) gets polls", async () => {
    const hh = household();
    const states: ConnectionState[] = [];
    const real = await device(hh, "phone");
    const laptop = await device(hh, "laptop");
    await real.register();
    await laptop.send(["phone"], "m1");
    const rec = recording();
    const f: typeof fetch = (input, init) => (String(input).includes("/v1/stream") ? Promise.resolve(new Response("not found", { status: 404 })) : rec.fetch(input, init));
    const phone = await device(hh, "phone", { fetch: f, log: () => {}, onState: (s) => states.push(s) });
    const l = await listenFor(phone, 1);
    await l.done;
    assert.deepEqual(l.got, expected(1));
    assert.ok(rec.paths.some((p) => p.startsWith("GET /v1/poll")));
    const err = await phone.stream().catch((e: unknown) => e);
    assert.ok(err instanceof StreamUnavailableError, String(err));
  });
});
