import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Keyring, MemoryPinStore, RelayClient, SealedClient } from "../index.js";
import { loadIdentity } from "../node.js";
import { FaultyProxy, cliPath, household, removeAtExit, startRelay, stopProcess, track } from "./relay.js";
import type { Relay } from "./relay.js";

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

let relay: Relay;
let dir: string;
before(async () => {
  relay = await startRelay();
  dir = await mkdtemp(join(tmpdir(), "cli-"));
  removeAtExit(dir);
});
after(async () => {
  await relay?.stop();
  await rm(dir, { recursive: true, force: true });
});

const cleanEnv = () => Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("FN_")));

/** The cursor a cursor file holds: its digits, then the store's epoch once a relay named one (NaN when it is not a cursor file). */
async function cursorIn(path: string): Promise<number> {
  const m = /^(\d+)(?: [A-Za-z0-9_-]{1,32})?\n$/.exec(await readFile(path, "utf8"));
  return m ? Number(m[1]) : NaN;
}

function start(args: string[], env: Record<string, string> = {}) {
  const child = spawn(process.execPath, [cliPath, ...args], { env: { ...cleanEnv(), ...env }, stdio: ["pipe", "pipe", "pipe"] });
  track(child);
  return child;
}

function cli(args: string[], opts: { env?: Record<string, string>; input?: string | Uint8Array } = {}): Promise<Result> {
  const child = start(args, opts.env);
  child.stdin.end(opts.input ?? "");
  return collect(child);
}

function collect(child: ReturnType<typeof start>): Promise<Result> {
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (s: string) => (stdout += s));
  child.stderr.setEncoding("utf8").on("data", (s: string) => (stderr += s));
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  return new Promise((resolve) =>
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    }),
  );
}

async function setup() {
  const hh = household();
  const phone = await relay.token(hh, "phone");
  const laptop = await relay.token(hh, "laptop");
  await new RelayClient({ url: relay.url, token: phone }).register();
  await new RelayClient({ url: relay.url, token: laptop }).register();
  return { hh, phone, laptop, common: ["-url", relay.url] };
}

describe("send", () => {
  test("prints the answer as one JSON line, the payload from the argument, a file or stdin", async () => {
    const { phone, laptop, common } = await setup();
    let r = await cli(["send", ...common, "-token", laptop, "-to", "phone", "-id", "c-1", "hello"]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, '{"id":"c-1","deliveries":[{"device":"phone","seq":1}]}\n');

    const file = join(dir, "payload.bin");
    await writeFile(file, new Uint8Array([0xfb, 0xff]));
    r = await cli(["send", ...common, "-token", laptop, "-to", "phone,laptop", "-file", file]);
    assert.equal(r.code, 0, r.stderr);
    const ans = JSON.parse(r.stdout) as { id: string; deliveries: unknown };
    assert.match(ans.id, /^[A-Za-z0-9_-]{22}$/, "a fresh id is 16 random bytes in base64url");
    assert.deepEqual(ans.deliveries, [{ device: "laptop", seq: 1 }, { device: "phone", seq: 2 }]);

    const tokenFile = join(dir, "laptop.token");
    await writeFile(tokenFile, `  ${laptop}\n`);
    r = await cli(["send", "-token-file", tokenFile, "-to", "phone", "-"], { input: "from stdin", env: { FN_RELAY_URL: relay.url } });
    assert.equal(r.code, 0, r.stderr);
    r = await cli(["send", "-to", "phone"], { input: "env token", env: { FN_RELAY_URL: relay.url, FN_TOKEN: laptop } });
    assert.equal(r.code, 0, r.stderr);

    const got = await new RelayClient({ url: relay.url, token: phone }).poll({ cursor: 0 });
    assert.deepEqual(
      got.envelopes.map((e) => [...e.payload]),
      [[...new TextEncoder().encode("hello")], [0xfb, 0xff], [...new TextEncoder().encode("from stdin")], [...new TextEncoder().encode("env token")]],
    );
  });

  test("refusals: exit 2 for the command line, exit 1 for the relay's", async () => {
    const { laptop, common } = await setup();
    const cases: [string[], number, RegExp][] = [
      [["send", ...common, "-to", "phone", "x"], 2, /no token/],
      [["send", ...common, "-token", laptop, "-codec", "msgpack", "-to", "phone", "x"], 2, /JSON only/],
      [["send", ...common, "-token", laptop, "-nope", "1", "x"], 2, /not defined: -nope/],
      [["send", ...common, "-token", laptop, "x"], 2, /-to/],
      [["send", ...common, "-token", laptop, "-to", "ghost", "x"], 1, /404 unknown_device/],
      [["send", ...common, "-token", "not.a.token", "-to", "phone", "x"], 1, /401 unauthorized/],
      [["listen", ...common, "-token", "not.a.token", "-wait", "1"], 1, /401 unauthorized/],
      [["listen", ...common, "-token", laptop, "-wait", "0"], 2, /-wait/],
      [["send", ...common, "-token", laptop, "-seal", "-to", "phone", "x"], 2, /-identity names no file/],
      [["send", ...common, "-token", laptop, "-seal=maybe", "-to", "phone", "x"], 2, /invalid boolean value "maybe" for -seal/],
      [["listen", ...common, "-token", laptop, "-open", "-identity", join(dir, "refusals.seed"), "-trust", "ghost", "-wait", "1"], 1, /-trust ghost: .*lists no key for ghost/],
      [["frobnicate"], 2, /unknown command/],
    ];
    for (const [args, code, err] of cases) {
      const r = await cli(args);
      assert.equal(r.code, code, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, err, args.join(" "));
      assert.equal(r.stdout, "", `${args.join(" ")} printed on stdout`);
    }
  });

  test("gives up after -timeout when the relay does not answer", async () => {
    const proxy = await FaultyProxy.start(relay.url);
    try {
      proxy.refuseNext(1000);
      const start = Date.now();
      const r = await cli(["send", "-url", proxy.url, "-token", "t", "-to", "phone", "-timeout", "1500ms", "x"]);
      assert.equal(r.code, 1, r.stderr);
      assert.match(r.stderr, /gave up/);
      assert.ok(Date.now() - start < 10_000);
      assert.ok(proxy.connections >= 1);
    } finally {
      await proxy.close();
    }
  });
});

describe("listen", () => {
  test("prints each envelope as one JSON line and persists the cursor; a new start neither repeats nor skips", async () => {
    const { phone, laptop, common } = await setup();
    const client = new RelayClient({ url: relay.url, token: laptop });
    await client.send(["phone"], "one", { id: "e1" });
    await client.send(["phone"], new Uint8Array([0xfb, 0xff]), { id: "e2" });
    await client.send(["phone"], "three", { id: "e3" });
    const cursorFile = join(dir, `${household()}.cursor`);

    let r = await cli(["listen", ...common, "-token", phone, "-cursor-file", cursorFile, "-count", "2", "-wait", "5"]);
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trimEnd().split("\n");
    assert.equal(lines.length, 2, r.stdout);
    const sentAt = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/;
    const first = JSON.parse(lines[0]!) as Record<string, unknown>;
    assert.deepEqual(Object.keys(first), ["seq", "id", "from", "sent_at", "payload"]);
    assert.match(String(first.sent_at), sentAt);
    assert.deepEqual({ ...first, sent_at: "" }, { seq: 1, id: "e1", from: "laptop", sent_at: "", payload: "b25l" });
    assert.deepEqual({ ...(JSON.parse(lines[1]!) as object), sent_at: "" }, { seq: 2, id: "e2", from: "laptop", sent_at: "", payload: "+/8=" });
    assert.equal(await cursorIn(cursorFile), 2);

    r = await cli(["listen", ...common, "-token", phone, "-cursor-file", cursorFile, "-count", "1", "-wait", "5"]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trimEnd().split("\n").map((l) => (JSON.parse(l) as { seq: number }).seq), [3]);
    assert.equal(await cursorIn(cursorFile), 3);
  });

  // Seen red when listen left the acknowledgement to a poll it never made.
  test("-count N acknowledges what it printed before it exits: the next listen, without a cursor file, goes on", async () => {
    const { phone, laptop, common } = await setup();
    const client = new RelayClient({ url: relay.url, token: laptop });
    await client.send(["phone"], "first", { id: "a1" });
    await client.send(["phone"], "second", { id: "a2" });
    for (const want of ["a1", "a2"]) {
      const r = await cli(["listen", ...common, "-token", phone, "-count", "1", "-wait", "2"]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal((JSON.parse(r.stdout) as { id: string }).id, want);
    }
  });

  test("a cursor file above the device's head recovers without losing envelopes", async () => {
    const { phone, laptop, common } = await setup();
    await new RelayClient({ url: relay.url, token: laptop }).send(["phone"], "kept");
    const cursorFile = join(dir, `${household()}.cursor`);
    await writeFile(cursorFile, "50\n");
    const r = await cli(["listen", ...common, "-token", phone, "-cursor-file", cursorFile, "-count", "1", "-wait", "5"]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { payload: string }).payload, "a2VwdA==");
    assert.match(r.stderr, /cursor_ahead|above the device's head/);
    assert.equal(await cursorIn(cursorFile), 1);
  });

  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    test(`${signal} stops it cleanly, exit 0`, async () => {
      const { phone, laptop, common } = await setup();
      await new RelayClient({ url: relay.url, token: laptop }).send(["phone"], "before");
      const cursorFile = join(dir, `${household()}.cursor`);
      const child = start(["listen", ...common, "-token", phone, "-cursor-file", cursorFile, "-wait", "30"]);
      child.stdin.end();
      const done = collect(child);
      // The first line says it runs; its next poll is then held.
      await new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
      const t0 = Date.now();
      child.kill(signal);
      const r = await done;
      assert.equal(r.code, 0, r.stderr);
      assert.ok(Date.now() - t0 < 5000, "did not stop promptly");
      assert.equal(r.stdout.trimEnd().split("\n").length, 1);
      assert.equal(await cursorIn(cursorFile), 1);
      await stopProcess(child);
    });
  }
});

describe("sealed", () => {
  test("send -seal and listen -open: the relay holds sealed bytes, listen prints the plaintext; identity and pins are kept in files", async () => {
    const { phone, laptop, common } = await setup();
    const phoneId = join(dir, `${household()}-phone.seed`);
    const laptopId = join(dir, `${household()}-laptop.seed`);
    // phone publishes its key first, from the seed file it makes.
    await SealedClient.register(new RelayClient({ url: relay.url, token: phone }), (await loadIdentity(phoneId)).identity, await Keyring.load(new MemoryPinStore()));
    let r = await cli(["send", ...common, "-token", laptop, "-seal", "-identity", laptopId, "-to", "phone", "-id", "sealed-1", "secret"]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, '{"id":"sealed-1","deliveries":[{"device":"phone","seq":1}]}\n');
    assert.match(await readFile(phoneId, "utf8"), /^[0-9a-f]{64}\n$/);
    assert.match(await readFile(`${laptopId}.pins`, "utf8"), /"phone"/);

    const raw = await new RelayClient({ url: relay.url, token: phone }).poll({ cursor: 0 });
    assert.deepEqual([...raw.envelopes[0]!.payload.subarray(0, 4)], [0x46, 0x4e, 0x45, 0x01]);

    r = await cli(["listen", ...common, "-token", phone, "-open", "-identity", phoneId, "-count", "1", "-wait", "5"]);
    assert.equal(r.code, 0, r.stderr);
    const line = JSON.parse(r.stdout) as { id: string; from: string; payload: string };
    assert.deepEqual([line.id, line.from, Buffer.from(line.payload, "base64").toString()], ["sealed-1", "laptop", "secret"]);
  });

  test("a changed key: listen -open prints the envelope with its error, send -seal refuses, -trust accepts the listed key", async () => {
    const { phone, laptop, common } = await setup();
    const hh = household();
    const phoneId = join(dir, `${hh}-phone.seed`);
    const cursorFile = join(dir, `${hh}-phone.cursor`);
    const listen = (...more: string[]) => cli(["listen", ...common, "-token", phone, "-open", "-identity", phoneId, "-count", "1", "-wait", "5", ...more]);
    await SealedClient.register(new RelayClient({ url: relay.url, token: phone }), (await loadIdentity(phoneId)).identity, await Keyring.load(new MemoryPinStore()));
    let r = await cli(["send", ...common, "-token", laptop, "-seal", "-identity", join(dir, `${hh}-laptop.seed`), "-to", "phone", "-id", "k-1", "old key"]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /created the identity .*laptop's fingerprint: \d{5}( \d{5}){5}/);
    r = await listen("-cursor-file", cursorFile);
    assert.equal(r.code, 0, r.stderr);
    assert.equal((JSON.parse(r.stdout) as { payload: string }).payload, Buffer.from("old key").toString("base64"));

    // laptop starts over with another identity: the directory lists another key.
    r = await cli(["send", ...common, "-token", laptop, "-seal", "-identity", join(dir, `${hh}-laptop2.seed`), "-to", "phone", "-id", "k-2", "new key"]);
    assert.equal(r.code, 0, r.stderr);
    r = await listen("-cursor-file", cursorFile);
    assert.equal(r.code, 0, r.stderr);
    const refusedLine = JSON.parse(r.stdout) as Record<string, unknown>;
    assert.deepEqual({ ...refusedLine, sent_at: "" }, { seq: 2, id: "k-2", from: "laptop", sent_at: "", payload: null, error: "key_changed" });
    assert.match(r.stderr, /laptop's key changed in the directory/);

    r = await cli(["send", ...common, "-token", phone, "-seal", "-identity", phoneId, "-to", "laptop", "-id", "k-3", "to whom?"]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /key_changed/);
    assert.equal(r.stdout, "");

    // Trusted, the held envelope opens (the relay no longer has it: listen acknowledged it).
    r = await listen("-trust", "laptop");
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /trusting laptop's key, fingerprint \d{5}/);
    const opened = JSON.parse(r.stdout) as { seq: number; payload: string; error?: string };
    assert.deepEqual([opened.seq, Buffer.from(opened.payload, "base64").toString(), opened.error], [2, "new key", undefined]);
    r = await cli(["send", ...common, "-token", phone, "-seal", "-identity", phoneId, "-to", "laptop", "-id", "k-4", "now"]);
    assert.equal(r.code, 0, r.stderr);
  });
});
