// Sealed envelopes through a real relay: the directory, sendSealed and a
// listen that opens, and a key changed in the directory reported and not
// sealed to.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Identity, Keyring, MemoryCursorStore, MemoryHeldStore, MemoryPinStore, RelayClient, SealError, SealedClient, readDirectory } from "../index.js";
import type { CursorStore, HeldStore, KeyChange, OpenedEnvelope } from "../index.js";
import { household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

const text = (b: Uint8Array) => new TextDecoder().decode(b);

let relay: Relay;
before(async () => {
  relay = await startRelay();
});
after(async () => {
  await relay?.stop();
});

interface Dev {
  client: RelayClient;
  sealed: SealedClient;
  changes: KeyChange[];
}

/** A registered device with a fresh identity and keyring. */
async function device(hh: string, name: string, identity?: Identity): Promise<Dev> {
  const client = new RelayClient({ url: relay.url, token: await relay.token(hh, name) });
  const changes: KeyChange[] = [];
  const keyring = await Keyring.load(new MemoryPinStore(), { onChange: (c) => changes.push(c) });
  const sealed = await SealedClient.register(client, identity ?? (await Identity.generate()), keyring);
  return { client, sealed, changes };
}

/** Listens until n envelopes opened or were refused; returns both. */
async function receive(d: Dev, n: number, opts: { cursorStore?: CursorStore; held?: HeldStore } = {}): Promise<{ opened: OpenedEnvelope[]; refused: SealError[] }> {
  const opened: OpenedEnvelope[] = [];
  const refused: SealError[] = [];
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), 20_000);
  const done = () => {
    if (opened.length + refused.length >= n) stop.abort();
  };
  await d.sealed.listen(
    (e) => {
      opened.push(e);
      done();
    },
    {
      ...opts,
      signal: stop.signal,
      wait: 5,
      onRefused: (_e, err) => {
        refused.push(err);
        done();
      },
    },
  );
  clearTimeout(timer);
  assert.equal(opened.length + refused.length, n, "timed out");
  return { opened, refused };
}

async function code(p: Promise<unknown>): Promise<string> {
  return p.then(
    () => "ok",
    (e: unknown) => (e instanceof SealError ? e.code : String(e)),
  );
}

describe("the directory", () => {
  test("register publishes the identity key; readDirectory reads every page", async () => {
    const hh = household();
    const ids = new Map<string, Identity>();
    for (const name of ["a", "b", "c", "d", "e"]) {
      const id = await Identity.generate();
      ids.set(name, id);
      await device(hh, name, id);
    }
    const bare = new RelayClient({ url: relay.url, token: await relay.token(hh, "f") });
    await bare.register(); // no key
    const dir = await readDirectory(bare, { pageSize: 2 });
    assert.deepEqual(dir.map((d) => d.device), ["a", "b", "c", "d", "e", "f"]);
    for (const d of dir.slice(0, 5)) {
      assert.deepEqual(d.identityKey, ids.get(d.device)!.publicKey, d.device);
      assert.deepEqual(d.x25519Key, ids.get(d.device)!.x25519PublicKey, `${d.device}: the relay's X25519 form agrees`);
      assert.match(d.registeredAt, /^\d{4}-\d\d-\d\dT/);
    }
    assert.equal(dir[5]!.identityKey, null);
    assert.equal(dir[5]!.x25519Key, null);
  });

  test("a directory page whose next does not move forward is refused, not followed forever", async () => {
    const hh = household();
    await device(hh, "a");
    let calls = 0;
    const looping: typeof fetch = async (input, init) => {
      calls++;
      const resp = await fetch(input, init);
      const body = (await resp.json()) as { devices: unknown[] };
      return new Response(JSON.stringify({ ...body, next: "a" }), { status: 200, headers: { "Content-Type": "application/json" } });
    };
    const client = new RelayClient({ url: relay.url, token: await relay.token(hh, "a"), fetch: looping });
    await assert.rejects(readDirectory(client), /does not follow/);
    assert.equal(calls, 2);
  });
});

describe("sealed sends", () => {
  test("laptop seals to phone and itself; each opens it; the relay holds only sealed bytes", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    const laptop = await device(hh, "laptop"); // its refresh pins phone too
    await phone.sealed.refresh(); // and phone pins laptop
    const res = await laptop.sealed.sendSealed("s-1", ["phone", "laptop"], "hello, sealed");
    assert.deepEqual(res.deliveries.map((d) => d.device), ["laptop", "phone"]);

    const raw = await phone.client.poll({ cursor: 0 });
    const payload = raw.envelopes[0]!.payload;
    assert.deepEqual([...payload.subarray(0, 4)], [0x46, 0x4e, 0x45, 0x01]);
    assert.ok(!Buffer.from(payload).includes("hello, sealed"), "the plaintext is not in the payload");

    for (const d of [phone, laptop]) {
      const { opened } = await receive(d, 1);
      assert.equal(text(opened[0]!.plaintext), "hello, sealed");
      assert.equal(opened[0]!.id, "s-1");
      assert.equal(opened[0]!.from, "laptop");
    }
  });

  test("a sender that registered after the recipient's last refresh is looked up and pinned on its first envelope", async () => {
    const hh = household();
    const phone = await device(hh, "phone"); // knows only itself
    const laptop = await device(hh, "laptop");
    await laptop.sealed.sendSealed("late-1", ["phone"], "first");
    const { opened } = await receive(phone, 1);
    assert.equal(text(opened[0]!.plaintext), "first");
    assert.deepEqual(phone.sealed.keyring.pinned("laptop"), laptop.sealed.identity.publicKey);
  });

  test("a device without a key cannot be sealed to; nothing is sent", async () => {
    const hh = household();
    const laptop = await device(hh, "laptop");
    const bare = new RelayClient({ url: relay.url, token: await relay.token(hh, "kiosk") });
    await bare.register();
    assert.equal(await code(laptop.sealed.sendSealed("k-1", ["kiosk"], "x")), "unknown_sender");
    assert.deepEqual((await bare.poll({ cursor: 0 })).envelopes, []);
  });
});

describe("a key changed in the directory", () => {
  test("is reported, not sealed to until trusted, and then sealed to", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    const laptop = await device(hh, "laptop");
    await phone.sealed.refresh();
    const oldKey = laptop.sealed.identity.publicKey;

    // laptop's token registers another key (a new install, or a relay that lies).
    const newLaptop = await device(hh, "laptop");
    const newKey = newLaptop.sealed.identity.publicKey;
    const changes = await phone.sealed.refresh();
    assert.deepEqual(changes, [{ device: "laptop", pinned: oldKey, seen: newKey }]);
    assert.deepEqual(phone.changes, changes, "reported to the app through onChange");

    assert.equal(await code(phone.sealed.sendSealed("c-1", ["laptop"], "to the old key?")), "key_changed");
    assert.equal(await code(phone.sealed.sendSealed("c-2", ["phone", "laptop"], "to both?")), "key_changed");
    assert.deepEqual((await newLaptop.client.poll({ cursor: 0 })).envelopes, [], "nothing was sent");
    await phone.sealed.refresh();
    assert.equal(phone.changes.length, 1, "the same change is reported once");

    await phone.sealed.keyring.trust("laptop", newKey);
    await phone.sealed.sendSealed("c-3", ["laptop"], "to the new key");
    const { opened } = await receive(newLaptop, 1);
    assert.equal(text(opened[0]!.plaintext), "to the new key");
  });

  test("a device with a new identity and its old keyring pins its own new key, reports no change and opens what it seals to itself", async () => {
    const hh = household();
    const store = new MemoryPinStore();
    const changes: KeyChange[] = [];
    const client = new RelayClient({ url: relay.url, token: await relay.token(hh, "laptop") });
    await SealedClient.register(client, await Identity.generate(), await Keyring.load(store));
    const next = await Identity.generate();
    const laptop = await SealedClient.register(client, next, await Keyring.load(store, { onChange: (c) => changes.push(c) }));
    assert.deepEqual(changes, []);
    assert.deepEqual(laptop.keyring.pinned("laptop"), next.publicKey);
    await laptop.sendSealed("self-1", ["laptop"], "note to self");
    const { opened } = await receive({ client, sealed: laptop, changes }, 1);
    assert.equal(text(opened[0]!.plaintext), "note to self");
  });

  test("an envelope sealed with the changed key is refused as key_changed, and the change reported", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    await device(hh, "laptop");
    await phone.sealed.refresh();
    const newLaptop = await device(hh, "laptop");
    await newLaptop.sealed.sendSealed("n-1", ["phone"], "from a new key");
    const { opened, refused } = await receive(phone, 1);
    assert.deepEqual(opened, []);
    assert.equal(refused[0]?.code, "key_changed");
    assert.deepEqual(phone.changes.map((c) => c.device), ["laptop"], "open read the directory and reported the change");
  });

  // Seen red when listen let the cursor move past it and kept nothing.
  test("an envelope refused as key_changed is held, opens once the new key is trusted, and can be dropped", async () => {
    const hh = household();
    const phone = await device(hh, "phone");
    await device(hh, "laptop");
    await phone.sealed.refresh();
    const newLaptop = await device(hh, "laptop");
    await newLaptop.sealed.sendSealed("h-1", ["phone"], "held, then opened");
    const cursorStore = new MemoryCursorStore();
    const held = new MemoryHeldStore();
    const { refused } = await receive(phone, 1, { cursorStore, held });
    assert.equal(refused[0]?.code, "key_changed");
    assert.equal(cursorStore.cursor, 1, "the cursor moved past it");
    assert.deepEqual((await held.load()).map((e) => e.id), ["h-1"]);

    await phone.sealed.trustListed("laptop");
    const { opened } = await receive(phone, 1, { cursorStore, held });
    assert.deepEqual(opened.map((e) => [e.id, text(e.plaintext)]), [["h-1", "held, then opened"]]);
    assert.deepEqual(await held.load(), []);

    const newer = await device(hh, "laptop");
    await newer.sealed.sendSealed("h-2", ["phone"], "from a key nobody trusts");
    assert.equal((await receive(phone, 1, { cursorStore, held })).refused[0]?.code, "key_changed");
    await phone.sealed.reopenHeld(() => assert.fail("reopened an envelope whose key is still not trusted"), { held });
    assert.equal(await phone.sealed.dropHeld("laptop", { held }), 1);
    assert.deepEqual(await held.load(), []);
  });
});
