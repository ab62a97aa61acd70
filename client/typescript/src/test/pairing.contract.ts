// The pairing and renewal tests of the TypeScript client. They need the
// relay on a fake clock behind the pairing contract's test server
// (internal/pairtest), which the Go test test/clients/pairing_test.go starts
// and names in PAIRTEST_URL; it runs this file with node --test. Not
// part of npm test, whose relays run on the real clock.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { MemoryCredentialStore, LocalStorageCredentialStore, RelayClient, RelayError, RenewingCredentials, UnauthorizedError, pair } from "../index.js";
import type { ConnectionState, Credentials, CredentialStore } from "../index.js";
import { cliPath } from "./relay.js";

const base = process.env.PAIRTEST_URL;
if (!base) throw new Error("PAIRTEST_URL is not set: run this from test/clients/pairing_test.go");
const URL_ = base;

async function control<T>(method: string, path: string): Promise<T> {
  const r = await fetch(URL_ + "/_test/" + path, { method });
  assert.equal(r.status, 200, `${method} ${path}: ${r.status}`);
  return (await r.json()) as T;
}

/** The test's clock, the relay's: read once, then moved by both together. */
let now = 0;
const clock = () => now;
async function advance(ms: number): Promise<void> {
  now = await control<number>("POST", `clock?ms=${ms}`);
}
const counts = () => control<{ renewals: number; refused: number }>("GET", "counts");

/** Pairs device into a fresh memory store (or store) and makes a client on a renewing source. */
async function paired(device: string, opts: { store?: CredentialStore; onState?: (s: ConnectionState) => void } = {}) {
  const store = opts.store ?? new MemoryCredentialStore();
  await pair(URL_, await control<string>("POST", `invite?device=${device}`), { store });
  return renewing(store, opts.onState);
}

async function renewing(store: CredentialStore, onState?: (s: ConnectionState) => void) {
  const source = await RenewingCredentials.open(URL_, store, { now: clock });
  const client = new RelayClient({ url: URL_, credentials: source, ...(onState && { onState }) });
  return { client, source, store };
}

/** Records the states a client reports. */
function states() {
  const seen: ConnectionState[] = [];
  return { seen, kinds: () => seen.map((s) => s.kind), on: (s: ConnectionState) => void seen.push(s) };
}

// Each test's renewals, as counted by the server, from a fresh start.
let before = { renewals: 0, refused: 0 };
async function since() {
  const c = await counts();
  return { renewals: c.renewals - before.renewals, refused: c.refused - before.refused };
}
async function start() {
  now = await control<number>("GET", "clock");
  before = await counts();
}

test("a listener with 2-minute tokens keeps receiving for 10 minutes without a 401 reaching the app", async () => {
  await start();
  const st = states();
  const { client: phone, source, store } = await paired("phone1", { onState: st.on });
  const laptop = new RelayClient({ url: URL_, token: await control<string>("POST", "mint?device=laptop&secs=3600") });
  await phone.register();
  const got: string[] = [];
  let wake: (() => void) | undefined;
  const stop = new AbortController();
  const listening = phone.listen(
    (e) => {
      got.push(new TextDecoder().decode(e.payload));
      wake?.();
    },
    { wait: 1, signal: stop.signal },
  );
  let failed: unknown;
  listening.catch((e: unknown) => {
    failed = e;
    wake?.();
  });
  for (let i = 0; i < 60; i++) {
    await advance(10_000);
    await laptop.send(["phone1"], `m${i}`);
    const deadline = Date.now() + 15_000;
    while (got.length <= i && failed === undefined) {
      const t = Math.max(0, deadline - Date.now());
      if (t === 0) assert.fail(`step ${i}: m${i} not received`);
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, t);
      });
    }
    assert.equal(failed, undefined, `listen rejected: ${String(failed)}`);
    assert.equal(got[i], `m${i}`);
  }
  stop.abort();
  await listening;
  const c = await since();
  assert.equal(c.refused, 0, "the relay answered 401");
  assert.ok(c.renewals >= 6 && c.renewals <= 7, `${c.renewals} renewals, want 6 or 7 (one per 80 or 90 s)`);
  // It streamed throughout, opening a stream again at each renewal.
  assert.ok(!st.kinds().includes("unauthorized") && !st.kinds().includes("waiting") && st.kinds().includes("connected"), `states ${st.kinds()}`);
  assert.deepEqual(await store.load(), source.credentials);
});

test("a 2-minute token is renewed when 40 s are left, not before", async () => {
  await start();
  const { client } = await paired("phone2");
  await advance(79_000);
  await client.register();
  assert.equal((await since()).renewals, 0);
  await advance(1_000);
  await client.register();
  assert.equal((await since()).renewals, 1);
});

test("a client clock 100 s ahead of the relay's renews its loaded token, then every 80 s, not on every call", async () => {
  await start();
  const store = new MemoryCredentialStore();
  await pair(URL_, await control<string>("POST", "invite?device=phone9"), { store });
  const source = await RenewingCredentials.open(URL_, store, { now: () => now + 100_000 });
  const client = new RelayClient({ url: URL_, credentials: source });
  for (const [advanceMs, renewals] of [[0, 1], [0, 1], [79_000, 1], [1_000, 2]] as const) {
    await advance(advanceMs);
    await client.register();
    assert.equal((await since()).renewals, renewals);
  }
});

test("a refused token is renewed once and the call made again", async () => {
  await start();
  const store = new MemoryCredentialStore();
  await pair(URL_, await control<string>("POST", "invite?device=phone3"), { store });
  const c = (await store.load())!;
  c.access_token = await control<string>("POST", "mint?device=phone3&secs=-3600"); // expired: refused
  c.access_expires_at = new Date(now + 86_400_000).toISOString(); // not due by the client's reckoning
  await store.save(c);
  const st = states();
  const { client } = await renewing(store, st.on);
  await client.register();
  assert.deepEqual(await since(), { renewals: 1, refused: 1 });
  assert.deepEqual(st.kinds(), ["connected"]);
});

test("concurrent calls that find the token due renew once (single flight)", async () => {
  await start();
  const { client, source } = await paired("phone4");
  await client.register();
  await advance(100_000);
  await control("POST", "hold");
  await Promise.all(Array.from({ length: 8 }, () => client.register()));
  assert.deepEqual(await since(), { renewals: 1, refused: 0 });
  assert.equal(Date.parse(source.credentials.access_expires_at), now + 120_000);
});

test("a replayed renewal secret is refused, and the first client reports unauthorized", async () => {
  await start();
  const st = states();
  const { client: phone, store } = await paired("phone5", { onState: st.on });
  const first = (await store.load())!;
  await advance(81_000);
  await phone.register(); // renews: first's secret is used
  await advance(31_000);
  const tst = states();
  const { client: thief } = await renewing(new MemoryCredentialStore(first), tst.on);
  await assert.rejects(thief.register(), UnauthorizedError);
  assert.deepEqual(tst.kinds(), ["unauthorized"]);
  await advance(80_000); // the phone's renewal is due
  await assert.rejects(phone.listen(() => {}, { wait: 1 }), UnauthorizedError);
  // listen reports why, then that it stopped.
  assert.deepEqual(st.kinds().slice(-2), ["unauthorized", "stopped"]);
});

test("a removed device's calls are refused with 401 and it reports unauthorized", async () => {
  await start();
  const st = states();
  const { client } = await paired("phone7", { onState: st.on });
  await client.register();
  await advance(1_000); // the removal comes after the token's iat
  await control("POST", "remove?device=phone7");
  await advance(1_000);
  // The error ends with what to do: only a new invitation helps.
  const next = "ask an admin for a new invitation and pair again";
  await assert.rejects(client.register(), (e: unknown) => e instanceof RelayError && e.status === 401 && endsWith(e, next));
  assert.equal(st.kinds().at(-1), "unauthorized");
  // Refused for good: the next call fails at once, without asking the relay.
  const c = await since();
  await assert.rejects(client.register(), (e: unknown) => e instanceof UnauthorizedError && endsWith(e, next));
  await assert.rejects(client.listen(() => {}, { wait: 1 }), (e: unknown) => e instanceof UnauthorizedError && endsWith(e, next));
  assert.deepEqual(await since(), c);
});

/** Whether e's message ends with next, saying so when it does not. */
function endsWith(e: unknown, next: string): boolean {
  assert.ok(e instanceof Error && e.message.endsWith(next), `${String(e)}: want it to end with ${JSON.stringify(next)}`);
  return true;
}

test("a set the store cannot save is not used", async () => {
  await start();
  let fail = false;
  const mem = new MemoryCredentialStore();
  const store: CredentialStore = {
    load: () => mem.load(),
    save: async (c: Credentials) => {
      if (fail) throw new Error("disk full");
      await mem.save(c);
    },
  };
  const { client, source } = await paired("phone6", { store });
  const old = source.credentials;
  await advance(95_000);
  fail = true;
  await client.register(); // the old token still works
  assert.deepEqual(source.credentials, old);
  await advance(26_000); // past its expiry, within the relay's 30 s grace
  await assert.rejects(client.register(), /disk full/);
  assert.deepEqual(source.credentials, old);
  assert.equal((await since()).renewals, 2);
});

test("pair with a wrong code is the relay's 401 and saves nothing", async () => {
  const store = new MemoryCredentialStore();
  await assert.rejects(pair(URL_, "WRONG-CODE0", { store }), (e: unknown) => e instanceof RelayError && e.status === 401 && endsWith(e, "ask an admin for a new invitation"));
  assert.equal(await store.load(), undefined);
});

test("pair sends the identity key, which the relay shows the inviting admin", async () => {
  const jwk = generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" });
  const key = new Uint8Array(Buffer.from(jwk.x!, "base64url"));
  const c = await pair(URL_, await control<string>("POST", "invite?device=watch"), { identityKey: key });
  assert.equal(c.device, "watch");
  assert.equal(await control<string>("GET", "identity?device=watch"), Buffer.from(key).toString("base64"));
});

test("the localStorage store keeps the credentials as JSON under its key", async () => {
  const m = new Map<string, string>();
  const storage = { getItem: (k: string) => m.get(k) ?? null, setItem: (k: string, v: string) => void m.set(k, v) };
  const s = new LocalStorageCredentialStore("creds", storage);
  assert.equal(await s.load(), undefined);
  const store = new MemoryCredentialStore();
  const c = await pair(URL_, await control<string>("POST", "invite?device=tab"), { store: s });
  assert.deepEqual(JSON.parse(m.get("creds")!), c);
  assert.deepEqual(await s.load(), c);
  assert.equal(c.url, URL_);
  assert.equal(await store.load(), undefined);
});

test("the command line's pair writes a credentials file that send and listen take with -store, renewed into it", async () => {
  const dir = await mkdtemp(join(tmpdir(), "pair-cli-"));
  const cli = (...args: string[]) => promisify(execFile)(process.execPath, [cliPath, ...args], { env: { PATH: process.env.PATH ?? "" } });
  try {
    const phoneFile = join(dir, "phone.json");
    const laptopFile = join(dir, "laptop.json");
    for (const [dev, file] of [["cli-phone", phoneFile], ["cli-laptop", laptopFile]] as const) {
      const { stdout } = await cli("pair", "-url", URL_, "-code", await control<string>("POST", `invite?device=${dev}`), "-store", file);
      assert.match(stdout, new RegExp(`paired as device "${dev}"`));
      assert.equal((await stat(file)).mode & 0o777, 0o600);
    }
    const paired = JSON.parse(await readFile(phoneFile, "utf8")) as Credentials;
    assert.equal(paired.url, URL_);
    // Due by the command's (real) clock: it renews before its first poll.
    await writeFile(phoneFile, JSON.stringify({ ...paired, access_expires_at: new Date(Date.now() + 10_000).toISOString() }));
    const before = (await counts()).renewals;
    const listening = cli("listen", "-store", phoneFile, "-wait", "1", "-count", "1");
    // The phone's first poll registers it: send until the relay knows it.
    for (let i = 0; ; i++) {
      try {
        await cli("send", "-store", laptopFile, "-to", "cli-phone", "-id", "one", "hello");
        break;
      } catch (e) {
        if (i > 200 || !String((e as { stderr?: string }).stderr).includes("unknown_device")) throw e;
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    const line = JSON.parse((await listening).stdout) as { id: string; from: string; payload: string };
    assert.deepEqual([line.id, line.from, atob(line.payload)], ["one", "cli-laptop", "hello"]);
    const renewed = JSON.parse(await readFile(phoneFile, "utf8")) as Credentials;
    assert.equal((await counts()).renewals - before, 1);
    assert.notEqual(renewed.renewal_secret, paired.renewal_secret);
    assert.equal(renewed.url, URL_);
    await assert.rejects(cli("pair", "-url", URL_, "-code", "WRONG", "-store", join(dir, "x.json")), /401/);
    await assert.rejects(stat(join(dir, "x.json")));
    await assert.rejects(cli("listen", "-store", join(dir, "none.json")), (e: { code?: number }) => e.code === 2);
    await assert.rejects(cli("send", "-store", phoneFile, "-token", "t", "-to", "a", "x"), (e: { code?: number }) => e.code === 2);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
