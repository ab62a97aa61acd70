// What the client does against a server that is not a well-behaved relay (a
// misconfigured proxy, a hostile or broken server): servers of node:http on
// loopback sockets that answer as the test says.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import { describe, test } from "node:test";

import { Backoff } from "../backoff.js";
import { MAX_ANSWER_BYTES, MAX_RETRY_AFTER_SECONDS, NoAnswerError, RelayClient, RelayError } from "../index.js";

interface Fake {
  url: string;
  close(): Promise<void>;
}

async function fakeRelay(handle: (req: IncomingMessage, res: ServerResponse) => void): Promise<Fake> {
  const server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address();
  if (addr === null || typeof addr === "string") throw new Error("no address");
  return {
    url: `http://127.0.0.1:${addr.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const MAX_TIMER_MS = 2 ** 31 - 1;

describe("Retry-After", () => {
  test("a huge Retry-After on 429 and 503 makes neither send nor listen loop", async () => {
    const counts = new Map<string, number>();
    const fake = await fakeRelay((req, res) => {
      const path = new URL(req.url!, "http://x").pathname;
      counts.set(path, (counts.get(path) ?? 0) + 1);
      // 2147484 s is just past what setTimeout takes in ms (2^31 - 1).
      const status = path === "/v1/send" ? 429 : 503;
      res.writeHead(status, { "Content-Type": "application/json", "Retry-After": "2147484" });
      res.end(JSON.stringify({ error: status === 429 ? "rate_limited" : "unavailable", message: "later" }));
    });
    try {
      const logged: string[] = [];
      const c = new RelayClient({ url: fake.url, token: "tok", log: (l) => logged.push(l) });
      // Over a bounded window each makes its first request and then waits
      // the cap; before, each spun about 500 times a second. listen's is a
      // stream: a 503 there is a reason to wait, not to poll instead.
      const window = AbortSignal.timeout(2000);
      const [sent, listened] = await Promise.allSettled([
        c.send(["phone"], "x", { signal: window }),
        c.listen(() => assert.fail("nothing is waiting"), { signal: window, wait: 1 }),
      ]);
      assert.equal(sent.status, "rejected");
      assert.match(String((sent as PromiseRejectedResult).reason), /gave up/);
      assert.equal(listened.status, "fulfilled");
      assert.deepEqual(Object.fromEntries(counts), { "/v1/send": 1, "/v1/stream": 1 }, `requests in 2 s; ${logged.length} retries, the first: ${logged.slice(0, 2).join("; ")}`);
      assert.equal(logged.length, 2);
      for (const l of logged) assert.match(l, / in 60000 ms$/);

      const err = await c.sendOnce(["phone"], "x", "id-0").catch((e: unknown) => e);
      assert.ok(err instanceof RelayError && err.status === 429, String(err));
      assert.equal(err.retryAfter, MAX_RETRY_AFTER_SECONDS);
    } finally {
      await fake.close();
    }
  });

  test("Backoff stays within setTimeout's range and the Retry-After cap", () => {
    const huge = new RelayError(503, { error: "unavailable" }, 2147484);
    assert.equal(new Backoff(1000).next(huge), MAX_RETRY_AFTER_SECONDS * 1000);
    const b = new Backoff(Number.MAX_SAFE_INTEGER);
    for (let i = 0; i < 64; i++) {
      const d = b.next(new NoAnswerError("reset"));
      assert.ok(d >= 1000 && d <= MAX_TIMER_MS, `refusal ${i + 1}: ${d} ms`);
    }
  });
});

describe("timers", () => {
  test("a request bound or a wait beyond setTimeout's range does not time out at once", async () => {
    // The fake answers after 200 ms: long enough that a timer fired after
    // about 1 ms (setTimeout's answer to a delay it cannot take) is seen.
    const fake = await fakeRelay((req, res) => {
      setTimeout(() => {
        res.writeHead(200, { "Content-Type": "application/json" });
        const path = new URL(req.url!, "http://x").pathname;
        res.end(path === "/v1/poll" ? `{"cursor":0,"more":false,"envelopes":[]}` : `{"household":"h","device":"phone","cursor":0}`);
      }, 200);
    });
    try {
      const c = new RelayClient({ url: fake.url, token: "tok", requestTimeoutMs: 2 ** 31 });
      assert.deepEqual(await c.register(), { household: "h", device: "phone", cursor: 0 });
      assert.deepEqual(await c.poll({ cursor: 0, wait: 2_200_000 }), { cursor: 0, more: false, envelopes: [] });
    } finally {
      await fake.close();
    }
  });
});

describe("redirects", () => {
  test("a redirect to another origin carries neither the token nor the body there", async () => {
    const elsewhere: string[] = [];
    const other = await fakeRelay((req, res) => {
      let body = "";
      req.on("data", (b) => (body += b));
      req.on("end", () => {
        elsewhere.push(`${req.method} ${req.url} ${req.headers.authorization ?? ""} ${body}`);
        res.writeHead(202, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ id: "x", deliveries: [] }));
      });
    });
    const fake = await fakeRelay((req, res) => {
      res.writeHead(307, { Location: other.url + req.url });
      res.end();
    });
    try {
      const c = new RelayClient({ url: fake.url, token: "secret-token" });
      await assert.rejects(c.sendOnce(["phone"], "the payload", "id-1"), NoAnswerError);
      await assert.rejects(c.poll({ cursor: 0, wait: 0 }), NoAnswerError);
      assert.deepEqual(elsewhere, []);
    } finally {
      await fake.close();
      await other.close();
    }
  });
});

describe("answer size", () => {
  const empty = `{"cursor":0,"more":false,"envelopes":[]}`;
  const MiB = Buffer.alloc(1 << 20, " ");

  /**
   * A fake whose poll answer is an empty poll padded with white space to
   * size bytes (valid JSON at any size), chunked, written as fast as the
   * client reads; written resolves to the bytes written once the answer
   * ended or its connection closed.
   */
  async function padded(size: number): Promise<Fake & { written: Promise<number> }> {
    let settle: (n: number) => void;
    const written = new Promise<number>((resolve) => (settle = resolve));
    const fake = await fakeRelay(async (_req, res) => {
      res.writeHead(200, { "Content-Type": "application/json" });
      let n = 0;
      res.on("close", () => settle(n));
      // Backpressure: a client that stops reading stops the writing.
      const write = (b: Buffer | string) =>
        new Promise<void>((resolve) => {
          n += Buffer.byteLength(b);
          if (res.write(b)) return resolve();
          const go = () => {
            res.off("drain", go).off("close", go);
            resolve();
          };
          res.on("drain", go).on("close", go);
        });
      await write(empty);
      while (n < size && !res.destroyed) await write(MiB.subarray(0, Math.min(MiB.length, size - n)));
      res.end();
    });
    return { ...fake, written };
  }

  test("an answer of exactly MAX_ANSWER_BYTES is read", async () => {
    const fake = await padded(MAX_ANSWER_BYTES);
    try {
      const c = new RelayClient({ url: fake.url, token: "tok" });
      assert.deepEqual(await c.poll({ cursor: 0 }), { cursor: 0, more: false, envelopes: [] });
      assert.equal(await fake.written, MAX_ANSWER_BYTES);
    } finally {
      await fake.close();
    }
  });

  for (const size of [MAX_ANSWER_BYTES + 1, 256 << 20]) {
    test(`an answer of ${size} bytes is refused, and reading stops past the bound`, async () => {
      const fake = await padded(size);
      try {
        const c = new RelayClient({ url: fake.url, token: "tok" });
        const err = await c.poll({ cursor: 0 }).catch((e: unknown) => e);
        assert.ok(err instanceof NoAnswerError, `want a NoAnswerError, got ${err instanceof Error ? String(err) : JSON.stringify(err)}`);
        assert.match(err.message, /^GET \/v1\/poll\?wait=0&cursor=0: the answer is larger than 64 MiB$/);
        // The client closed the connection: the server wrote the bound
        // and what the sockets' buffers held, not the whole answer.
        const n = await fake.written;
        assert.ok(n <= MAX_ANSWER_BYTES + (16 << 20), `the server wrote ${n} bytes`);
      } finally {
        await fake.close();
      }
    });
  }
});
