// Seals one envelope (laptop to phone and tablet, fresh identities), then
// opens, as phone, every variant with one bit flipped and every prefix,
// and prints the envelope, the seeds and each variant's result as JSON:
// test/clients/seal_test.go opens the same variants with the Go client and
// holds it to the same result for each (TestSealedDifferential).
import { Identity, SealError, open, seal } from "../index.js";

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const [laptop, phone, tablet] = await Promise.all([Identity.generate(), Identity.generate(), Identity.generate()]);
const pins = new Map([
  ["laptop", laptop.publicKey],
  ["phone", phone.publicKey],
  ["tablet", tablet.publicKey],
]);
const params = { household: "home", id: "diff-1", from: "laptop", device: "phone", identity: phone, pinned: (d: string) => pins.get(d) };
const sealed = await seal(
  { household: "home", id: "diff-1", sender: "laptop", identity: laptop, recipients: [{ device: "phone", key: phone.publicKey }, { device: "tablet", key: tablet.publicKey }] },
  new TextEncoder().encode("the same answer in Go and TypeScript"),
);

async function result(b: Uint8Array): Promise<string> {
  try {
    await open(b, params);
    return "ok";
  } catch (e) {
    if (e instanceof SealError) return e.code;
    throw e;
  }
}

const flipped: string[] = [];
for (let i = 0; i < sealed.length * 8; i++) {
  const b = new Uint8Array(sealed);
  b[i >> 3]! ^= 1 << (i & 7);
  flipped.push(await result(b));
}
const prefixes: string[] = [];
for (let n = 0; n <= sealed.length; n++) prefixes.push(await result(sealed.subarray(0, n)));

process.stdout.write(
  JSON.stringify({ seeds: { laptop: hex(laptop.seed), phone: hex(phone.seed), tablet: hex(tablet.seed) }, sealed: hex(sealed), flipped, prefixes }) + "\n",
);
