// The committed test vectors (seal/testdata/e2e/vectors.json), shared
// with the Go client: each device's keys and fingerprint, each safety
// number, each valid envelope opened to its plaintext and each invalid one
// refused with its code. The same checker runs on vectors made here, so a
// checker that checks nothing fails.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, test } from "node:test";

import { Identity, SealError, fingerprint, open, safetyNumber, seal } from "../index.js";
import { repoRoot } from "./relay.js";

export const vectorsPath = join(repoRoot, "seal", "testdata", "e2e", "vectors.json");

interface Case {
  name: string;
  household: string;
  id: string;
  from: string;
  opener: string;
  sealed: string;
}

export interface Vectors {
  format: number;
  devices: { household: string; device: string; seed: string; public: string; x25519_public: string; fingerprint: string }[];
  safety_numbers: { a: string; b: string; number: string }[];
  valid: (Case & { plaintext: string })[];
  invalid: (Case & { error: string })[];
}

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const unhex = (s: string) => new Uint8Array(Buffer.from(s, "hex"));

/** Checks every vector; returns one line per failure (empty: all hold). */
export async function checkVectors(v: Vectors): Promise<string[]> {
  const bad: string[] = [];
  if (v.format !== 1) bad.push(`format ${v.format}`);
  const ids = new Map<string, Identity>();
  for (const d of v.devices) {
    const id = await Identity.fromSeed(unhex(d.seed));
    ids.set(d.device, id);
    if (hex(id.publicKey) !== d.public) bad.push(`device ${d.device}: public ${hex(id.publicKey)}, want ${d.public}`);
    if (hex(id.x25519PublicKey) !== d.x25519_public) bad.push(`device ${d.device}: x25519 ${hex(id.x25519PublicKey)}, want ${d.x25519_public}`);
    const fp = await fingerprint(id.publicKey);
    if (fp !== d.fingerprint) bad.push(`device ${d.device}: fingerprint ${fp}, want ${d.fingerprint}`);
  }
  for (const s of v.safety_numbers) {
    const a = ids.get(s.a);
    const b = ids.get(s.b);
    if (!a || !b) {
      bad.push(`safety number ${s.a}/${s.b}: no such devices`);
      continue;
    }
    const n = await safetyNumber(a.publicKey, b.publicKey);
    if (n !== s.number) bad.push(`safety number ${s.a}/${s.b}: ${n}, want ${s.number}`);
  }
  // Openers pin every device first.
  const pins = new Map([...ids].map(([d, id]) => [d, id.publicKey]));
  const params = (c: Case) => {
    const identity = ids.get(c.opener);
    if (!identity) throw new Error(`${c.name}: opener ${c.opener} is not a device of the vectors`);
    return { household: c.household, id: c.id, from: c.from, device: c.opener, identity, pinned: (d: string) => pins.get(d) };
  };
  for (const c of v.valid) {
    try {
      const pt = await open(unhex(c.sealed), params(c));
      if (hex(pt) !== c.plaintext) bad.push(`valid ${JSON.stringify(c.name)}: plaintext ${hex(pt)}, want ${c.plaintext}`);
    } catch (e) {
      bad.push(`valid ${JSON.stringify(c.name)}: ${String(e)}`);
    }
  }
  for (const c of v.invalid) {
    try {
      await open(unhex(c.sealed), params(c));
      bad.push(`invalid ${JSON.stringify(c.name)}: opened, want ${c.error}`);
    } catch (e) {
      const code = e instanceof SealError ? e.code : String(e);
      if (code !== c.error) bad.push(`invalid ${JSON.stringify(c.name)}: ${code}, want ${c.error} (${String(e)})`);
    }
  }
  return bad;
}

/** A small set of vectors in the committed file's schema, made by this client. */
async function makeVectors(): Promise<Vectors> {
  const seeds = { phone: new Uint8Array(32).fill(1), laptop: new Uint8Array(32).fill(2) };
  const phone = await Identity.fromSeed(seeds.phone);
  const laptop = await Identity.fromSeed(seeds.laptop);
  const device = async (name: string, id: Identity, seed: Uint8Array) => ({
    household: "home", device: name, seed: hex(seed), public: hex(id.publicKey), x25519_public: hex(id.x25519PublicKey), fingerprint: await fingerprint(id.publicKey),
  });
  const pt = new TextEncoder().encode("hello phone");
  const sealed = await seal({ household: "home", id: "v-1", sender: "laptop", identity: laptop, recipients: [{ device: "phone", key: phone.publicKey }] }, pt);
  const flipped = new Uint8Array(sealed);
  flipped[flipped.length - 70]! ^= 1; // in the ciphertext
  const base = { household: "home", id: "v-1", from: "laptop", opener: "phone" };
  return {
    format: 1,
    devices: [await device("phone", phone, seeds.phone), await device("laptop", laptop, seeds.laptop)],
    safety_numbers: [{ a: "phone", b: "laptop", number: await safetyNumber(phone.publicKey, laptop.publicKey) }],
    valid: [{ name: "laptop to phone", ...base, sealed: hex(sealed), plaintext: hex(pt) }],
    invalid: [
      { name: "flipped bit in the ciphertext", ...base, sealed: hex(flipped), error: "signature" },
      { name: "wrong id", ...base, id: "v-2", sealed: hex(sealed), error: "wrong_id" },
      { name: "not addressed", ...base, opener: "laptop", sealed: hex(sealed), error: "not_addressed" },
    ],
  };
}

describe("test vectors", () => {
  test("the checker passes vectors made here and catches each wrong one", async () => {
    const v = await makeVectors();
    assert.deepEqual(await checkVectors(v), []);
    const wrong = structuredClone(v);
    wrong.devices[0]!.fingerprint = "00000 00000 00000 00000 00000 00000";
    wrong.devices[1]!.x25519_public = "00".repeat(32);
    wrong.safety_numbers[0]!.number = "0";
    wrong.valid[0]!.plaintext = "00";
    wrong.invalid[0]!.error = "decrypt";
    wrong.invalid.push({ ...v.valid[0]!, name: "valid as invalid", error: "decrypt" });
    const bad = await checkVectors(wrong);
    assert.equal(bad.length, 6, bad.join("\n"));
  });

  test("seal/testdata/e2e/vectors.json: every vector holds", async (t) => {
    const raw = await readFile(vectorsPath, "utf8");
    const v = JSON.parse(raw) as Vectors;
    assert.ok(v.valid.length > 0 && v.invalid.length > 0 && v.devices.length > 0, "the file holds vectors");
    assert.deepEqual(await checkVectors(v), []);
    t.diagnostic(`${v.devices.length} devices, ${v.safety_numbers.length} safety numbers, ${v.valid.length} valid and ${v.invalid.length} invalid envelopes`);
  });
});
