// The identity keys every client refuses (seal/testdata/keys), shared
// with the Go client: the TypeScript client pins and seals to exactly the
// keys the Go client does.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";

import { Keyring, MemoryPinStore, checkIdentityKey } from "../index.js";
import { repoRoot } from "./relay.js";

interface KeyVector {
  key: string;
  verdict: "ok" | "small_order" | "not_a_point";
  note: string;
}

const hex = (s: string) => Uint8Array.from(s.match(/../g)!.map((b) => parseInt(b, 16)));

test("identity keys: the verdict of every shared vector, by the check and by the keyring", async () => {
  const file = JSON.parse(await readFile(join(repoRoot, "seal", "testdata", "keys", "identity_keys.json"), "utf8")) as { keys: KeyVector[] };
  assert.ok(file.keys.filter((k) => k.verdict === "small_order").length >= 8, "the vectors hold every small-order point");
  const ring = await Keyring.load(new MemoryPinStore());
  for (const v of file.keys) {
    const key = hex(v.key);
    const refused = (() => {
      try {
        checkIdentityKey(key);
        return false;
      } catch {
        return true;
      }
    })();
    assert.equal(refused, v.verdict !== "ok", `${v.key} (${v.note}): refused ${refused}, verdict ${v.verdict}`);
    const device = `d${v.key.slice(0, 8)}`;
    if (v.verdict === "ok") {
      await ring.see(device, key);
      assert.deepEqual(ring.pinned(device), key);
    } else {
      await assert.rejects(ring.see(device, key), `${v.note}: pinned`);
      assert.equal(ring.pinned(device), undefined);
    }
  }
});
