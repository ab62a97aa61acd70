// The sealed-envelope format without a relay: round trips, every refusal
// with its code, fingerprints, identities and the keyring.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Identity, Keyring, MemoryPinStore, SealError, fingerprint, keyId, open, safetyNumber, seal, x25519PublicKey } from "../index.js";
import type { KeyChange, SealErrorCode } from "../index.js";

const utf8 = new TextEncoder();
const text = (b: Uint8Array) => new TextDecoder().decode(b);
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const unhex = (s: string) => new Uint8Array(Buffer.from(s, "hex"));

interface World {
  laptop: Identity;
  phone: Identity;
  tablet: Identity;
  pins: Map<string, Uint8Array>;
}

async function world(): Promise<World> {
  const [laptop, phone, tablet] = await Promise.all([Identity.generate(), Identity.generate(), Identity.generate()]);
  const pins = new Map([
    ["laptop", laptop.publicKey],
    ["phone", phone.publicKey],
    ["tablet", tablet.publicKey],
  ]);
  return { laptop, phone, tablet, pins };
}

/** laptop seals for phone then tablet, in household home, id "m-1". */
async function sample(w: World, plaintext = utf8.encode("hello phone")): Promise<Uint8Array> {
  return seal(
    {
      household: "home",
      id: "m-1",
      sender: "laptop",
      identity: w.laptop,
      recipients: [
        { device: "phone", key: w.phone.publicKey },
        { device: "tablet", key: w.tablet.publicKey },
      ],
    },
    plaintext,
  );
}

function opener(w: World, over: Partial<{ household: string; id: string; from: string; device: "phone" | "tablet" | "laptop" }> = {}) {
  const device = over.device ?? "phone";
  return { household: over.household ?? "home", id: over.id ?? "m-1", from: over.from ?? "laptop", device, identity: w[device], pinned: (d: string) => w.pins.get(d) };
}

async function refused(p: Promise<unknown>, code: SealErrorCode, what: string): Promise<void> {
  const err = await p.then(
    () => assert.fail(`${what}: opened, want ${code}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof SealError, `${what}: ${String(err)}`);
  assert.equal(err.code, code, `${what}: ${err.message}`);
}

/**
 * The offsets of sample's parts, computed from the layout (not by the
 * parser under test): household "home", id "m-1", sender "laptop", two
 * slots "phone" and "tablet".
 */
function layout(sealed: Uint8Array) {
  let at = 4;
  const part = (n: number) => {
    const start = at;
    at += n;
    return start;
  };
  const household = part(1 + 4);
  const id = part(1 + 3);
  const sender = part(1 + 6);
  const senderKey = part(32);
  const count = part(1);
  const phone = { name: part(1 + 5), keyId: part(8), enc: part(32), wrapped: part(48) };
  const tablet = { name: part(1 + 6), keyId: part(8), enc: part(32), wrapped: part(48) };
  const nonce = part(12);
  const headerEnd = at;
  const length = part(4);
  const ciphertext = part(sealed.length - 64 - at);
  const signature = part(64);
  assert.equal(at, sealed.length);
  return { household, id, sender, senderKey, count, phone, tablet, nonce, headerEnd, length, ciphertext, signature };
}

function flip(b: Uint8Array, at: number, bit = 0): Uint8Array {
  const c = new Uint8Array(b);
  c[at]! ^= 1 << bit;
  return c;
}

/** The envelope signed again by laptop after a change, as a sender that tampers with its own envelope would. */
async function resign(w: World, b: Uint8Array): Promise<Uint8Array> {
  const signed = b.subarray(0, b.length - 64);
  const sig = await w.laptop.sign(new Uint8Array([...utf8.encode("fn-seal v1 sig"), 0, ...signed]));
  return new Uint8Array([...signed, ...sig]);
}

describe("seal and open", () => {
  test("every recipient opens; the layout is the format's", async () => {
    const w = await world();
    const sealed = await sample(w);
    const l = layout(sealed);
    assert.equal(hex(sealed.subarray(0, 4)), "464e4501");
    assert.equal(text(sealed.subarray(l.household, l.household + 5)), "\x04home");
    assert.deepEqual(sealed.subarray(l.senderKey, l.senderKey + 32), w.laptop.publicKey);
    assert.deepEqual(sealed.subarray(l.phone.keyId, l.phone.keyId + 8), await keyId(w.phone.publicKey));
    assert.equal(new DataView(sealed.buffer).getUint32(l.length), "hello phone".length + 16);
    assert.equal(text(await open(sealed, opener(w))), "hello phone");
    assert.equal(text(await open(sealed, opener(w, { device: "tablet" }))), "hello phone");
  });

  test("empty, binary and large plaintexts; a sender sealing to itself", async () => {
    const w = await world();
    for (const pt of [new Uint8Array(0), new Uint8Array([0, 255, 1, 254]), crypto.getRandomValues(new Uint8Array(60_000))]) {
      assert.deepEqual(await open(await sample(w, pt), opener(w)), pt);
    }
    const self = await seal({ household: "home", id: "s", sender: "laptop", identity: w.laptop, recipients: [{ device: "laptop", key: w.laptop.publicKey }] }, utf8.encode("note"));
    assert.equal(text(await open(self, opener(w, { device: "laptop", id: "s" }))), "note");
  });

  test("two seals of one plaintext differ (fresh content key, nonce and encapsulation)", async () => {
    const w = await world();
    const a = await sample(w);
    const b = await sample(w);
    assert.equal(a.length, b.length);
    assert.notEqual(hex(a), hex(b));
    const l = layout(a);
    for (const [name, at, n] of [["enc", l.phone.enc, 32], ["nonce", l.nonce, 12]] as const) {
      assert.notEqual(hex(a.subarray(at, at + n)), hex(b.subarray(at, at + n)), name);
    }
  });

  test("seal refuses bad input", async () => {
    const w = await world();
    const base = { household: "home", id: "m", sender: "laptop", identity: w.laptop };
    const cases: [string, Parameters<typeof seal>[0]][] = [
      ["no recipients", { ...base, recipients: [] }],
      ["a repeated recipient", { ...base, recipients: [{ device: "phone", key: w.phone.publicKey }, { device: "phone", key: w.phone.publicKey }] }],
      ["a bad household", { ...base, household: "h/h", recipients: [{ device: "phone", key: w.phone.publicKey }] }],
      ["a bad id", { ...base, id: "", recipients: [{ device: "phone", key: w.phone.publicKey }] }],
      ["a key of 31 bytes", { ...base, recipients: [{ device: "phone", key: w.phone.publicKey.subarray(1) }] }],
    ];
    for (const [what, p] of cases) await assert.rejects(seal(p, utf8.encode("x")), /seal: /, what);
  });
});

describe("every refusal has its code", () => {
  test("a flipped bit in each part", async () => {
    const w = await world();
    const sealed = await sample(w);
    const l = layout(sealed);
    const cases: [string, Uint8Array, SealErrorCode][] = [
      ["magic", flip(sealed, 0), "malformed"],
      ["version", flip(sealed, 3, 1), "version"],
      ["household length", flip(sealed, l.household, 0), "malformed"],
      ["household", flip(sealed, l.household + 1), "wrong_household"],
      ["household, not a name", flip(sealed, l.household + 1, 7), "malformed"],
      ["id", flip(sealed, l.id + 1), "wrong_id"],
      ["sender", flip(sealed, l.sender + 1), "wrong_sender"],
      ["sender key", flip(sealed, l.senderKey + 5), "key_changed"],
      ["count to 0", flip(sealed, l.count, 1), "malformed"],
      ["count to 3", flip(sealed, l.count, 0), "malformed"],
      ["slot name", flip(sealed, l.phone.name + 1), "signature"],
      ["slot key id", flip(sealed, l.phone.keyId), "signature"],
      ["slot enc", flip(sealed, l.phone.enc + 3), "signature"],
      ["slot wrapped", flip(sealed, l.phone.wrapped + 47), "signature"],
      ["nonce", flip(sealed, l.nonce), "signature"],
      ["length", flip(sealed, l.length + 3), "malformed"],
      ["ciphertext", flip(sealed, l.ciphertext + 2), "signature"],
      ["signature", flip(sealed, l.signature + 63, 7), "signature"],
      ["a byte after the signature", new Uint8Array([...sealed, 0]), "malformed"],
      ["cut short", sealed.subarray(0, sealed.length - 1), "malformed"],
      ["version 2", (() => { const c = new Uint8Array(sealed); c[3] = 2; return c; })(), "version"],
      ["nothing", new Uint8Array(0), "malformed"],
    ];
    for (const [what, b, code] of cases) await refused(open(b, opener(w)), code, what);
  });

  test("signed again by the sender: the slot and the content are still bound", async () => {
    const w = await world();
    const sealed = await sample(w);
    const l = layout(sealed);
    const cases: [string, Uint8Array, SealErrorCode][] = [
      ["the slot's name", flip(sealed, l.phone.name + 1), "not_addressed"],
      ["the slot's key id", flip(sealed, l.phone.keyId + 7), "not_addressed"],
      ["the slot's enc", flip(sealed, l.phone.enc + 3), "decrypt"],
      ["the slot's wrapped key", flip(sealed, l.phone.wrapped), "decrypt"],
      ["the nonce", flip(sealed, l.nonce + 11), "decrypt"],
      ["the ciphertext", flip(sealed, l.ciphertext), "decrypt"],
      ["the tag", flip(sealed, l.signature - 1), "decrypt"],
      // The header is the content's associated data: a change to another
      // recipient's slot breaks phone's content too.
      ["the other slot's enc", flip(sealed, l.tablet.enc), "decrypt"],
    ];
    for (const [what, b, code] of cases) await refused(open(await resign(w, b), opener(w)), code, what);
    // Sanity: signed again unchanged, it opens.
    assert.equal(text(await open(await resign(w, sealed), opener(w))), "hello phone");
  });

  test("an envelope of no recipients, well signed, is malformed", async () => {
    const w = await world();
    const sealed = await sample(w);
    const l = layout(sealed);
    // The header without its two slots and with count 0, the body as it was.
    const noSlots = new Uint8Array([...sealed.subarray(0, l.count), 0, ...sealed.subarray(l.nonce, l.signature)]);
    await refused(open(await resign(w, new Uint8Array([...noSlots, ...new Uint8Array(64)])), opener(w)), "malformed", "no recipients");
  });

  test("replayed to another device, under another id, in another household, from another sender", async () => {
    const w = await world();
    const sealed = await sample(w);
    await refused(open(sealed, opener(w, { device: "laptop" })), "not_addressed", "to a device not addressed");
    await refused(open(sealed, opener(w, { id: "m-2" })), "wrong_id", "under another id");
    await refused(open(sealed, opener(w, { household: "work" })), "wrong_household", "in another household");
    await refused(open(sealed, opener(w, { from: "tablet" })), "wrong_sender", "the relay names another sender");
    // A device that took phone's name with another key is not addressed either.
    const impostor = await Identity.generate();
    await refused(open(sealed, { ...opener(w), identity: impostor }), "not_addressed", "phone's name, another key");
  });

  test("the sender's key must be the pinned one", async () => {
    const w = await world();
    const sealed = await sample(w);
    const other = await Identity.generate();
    await refused(open(sealed, { ...opener(w), pinned: () => undefined }), "unknown_sender", "nothing pinned");
    await refused(open(sealed, { ...opener(w), pinned: () => other.publicKey }), "key_changed", "another key pinned");
    // A relay that swapped laptop's key and sealed with its own is caught by the pin.
    const forged = await seal({ household: "home", id: "m-1", sender: "laptop", identity: other, recipients: [{ device: "phone", key: w.phone.publicKey }] }, utf8.encode("forged"));
    await refused(open(forged, opener(w)), "key_changed", "sealed with another key under laptop's name");
  });
});

describe("keys", () => {
  test("an identity is its seed: the same keys from it again; the X25519 key is the Ed25519 key's Montgomery form", async () => {
    // RFC 8032, section 7.1, test 1.
    const id = await Identity.fromSeed(unhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"));
    assert.equal(hex(id.publicKey), "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
    const again = await Identity.fromSeed(id.seed);
    assert.deepEqual(again.publicKey, id.publicKey);
    // X25519 of the private half (first 32 bytes of SHA-512(seed)) with the
    // base point, by WebCrypto, equals the conversion of the public key.
    const h = new Uint8Array(await crypto.subtle.digest("SHA-512", new Uint8Array(id.seed)));
    const pkcs8 = new Uint8Array([...unhex("302e020100300506032b656e04220420"), ...h.subarray(0, 32)]);
    const priv = await crypto.subtle.importKey("pkcs8", pkcs8, { name: "X25519" }, true, ["deriveBits"]);
    const jwk = await crypto.subtle.exportKey("jwk", priv);
    assert.equal(Buffer.from(jwk.x!, "base64url").toString("hex"), hex(id.x25519PublicKey));
    assert.deepEqual(x25519PublicKey(id.publicKey), id.x25519PublicKey);
    await assert.rejects(Identity.fromSeed(new Uint8Array(31)), /32 bytes/);
  });

  test("fingerprints: 6 groups of 5 digits; the safety number is the same on both sides", async () => {
    const a = await Identity.generate();
    const b = await Identity.generate();
    const fa = await fingerprint(a.publicKey);
    assert.match(fa, /^\d{5}( \d{5}){5}$/);
    assert.equal(fa, await fingerprint(a.publicKey));
    assert.notEqual(fa, await fingerprint(b.publicKey));
    const n = await safetyNumber(a.publicKey, b.publicKey);
    assert.equal(n, await safetyNumber(b.publicKey, a.publicKey));
    assert.match(n, /^\d{5}( \d{5}){11}$/);
    const fb = await fingerprint(b.publicKey);
    assert.equal(n, [fa, fb].sort().join(" "));
    // Computed by hand for a fixed key: the groups are the big-endian
    // 40-bit integers of the digest's first 30 bytes, mod 100000.
    const key = new Uint8Array(32);
    const d = new Uint8Array(await crypto.subtle.digest("SHA-256", new Uint8Array([...utf8.encode("fn-seal v1 fingerprint"), 0, ...key])));
    const groups = [0, 1, 2, 3, 4, 5].map((i) => String(Number(BigInt("0x" + hex(d.subarray(5 * i, 5 * i + 5))) % 100000n)).padStart(5, "0"));
    assert.equal(await fingerprint(key), groups.join(" "));
  });
});

describe("keyring", () => {
  test("pins on first sight, reports a changed key once, refuses to seal to it until trusted, and keeps all that in its store", async () => {
    const store = new MemoryPinStore();
    const changes: KeyChange[] = [];
    const k = await Keyring.load(store, { onChange: (c) => changes.push(c) });
    const [a, b, c] = await Promise.all([Identity.generate(), Identity.generate(), Identity.generate()]);

    assert.throws(() => k.sealKey("laptop"), (e: unknown) => e instanceof SealError && e.code === "unknown_sender");
    assert.equal(await k.see("laptop", a.publicKey), undefined);
    assert.equal(await k.see("phone", null), undefined);
    assert.deepEqual(k.sealKey("laptop"), a.publicKey);
    assert.equal(k.pinned("phone"), undefined);

    const change = await k.see("laptop", b.publicKey);
    assert.deepEqual(change, { device: "laptop", pinned: a.publicKey, seen: b.publicKey });
    assert.deepEqual(changes, [change]);
    await k.see("laptop", b.publicKey); // seen again: not reported again
    assert.equal(changes.length, 1);
    assert.deepEqual(k.pinned("laptop"), a.publicKey, "the pin is kept");
    assert.throws(() => k.sealKey("laptop"), (e: unknown) => e instanceof SealError && e.code === "key_changed");

    // A fresh keyring from the store remembers the pin and the change.
    const k2 = await Keyring.load(store);
    assert.deepEqual(k2.pinned("laptop"), a.publicKey);
    assert.deepEqual(k2.changes(), [{ device: "laptop", pinned: a.publicKey, seen: b.publicKey }]);
    assert.throws(() => k2.sealKey("laptop"), (e: unknown) => e instanceof SealError && e.code === "key_changed");

    await k.see("laptop", c.publicKey); // yet another key: reported
    assert.equal(changes.length, 2);
    await k.trust("laptop", b.publicKey);
    assert.deepEqual(k.sealKey("laptop"), b.publicKey);
    assert.deepEqual(k.changes(), []);
    assert.deepEqual((await Keyring.load(store)).sealKey("laptop"), b.publicKey);
  });

  test("refuses what is not a key, and a store that holds no keyring", async () => {
    const k = await Keyring.load(new MemoryPinStore());
    await assert.rejects(k.see("laptop", new Uint8Array(32).fill(0xff)), /not an Ed25519 public key/);
    await assert.rejects(k.see("laptop", new Uint8Array(31)), /not an Ed25519 public key/);
    await assert.rejects(Keyring.load(new MemoryPinStore("{nope")), /holds no keyring/);
    await assert.rejects(Keyring.load(new MemoryPinStore('{"format":2,"pins":{},"changed":{}}')), /holds no keyring/);
  });

  test("a device named __proto__ is pinned like any other", async () => {
    const store = new MemoryPinStore();
    const k = await Keyring.load(store);
    const a = await Identity.generate();
    await k.see("__proto__", a.publicKey);
    assert.deepEqual((await Keyring.load(store)).pinned("__proto__"), a.publicKey);
  });
});
