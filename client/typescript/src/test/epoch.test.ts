// Store epochs, against a stand-in relay whose store history goes back.
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, test } from "node:test";

import { MemoryCursorStore, RelayClient, RelayError } from "../index.js";
import type { ConnectionState, Envelope } from "../index.js";
import { FileCursorStore } from "../node.js";
import { EpochRelay } from "./epoch-relay.js";
import type { Request } from "./epoch-relay.js";
import { eventually } from "./relay.js";

const A = "AAAAAAAAAAAAAAAA";
const B = "BBBBBBBBBBBBBBBB";

let relay: EpochRelay;
beforeEach(async () => {
  relay = await EpochRelay.start(A);
});
afterEach(async () => {
  await relay.stop();
});

const show = (q: Request) => `${q.op} ${q.cursor ?? "-"} ${q.epoch ?? "-"} ${q.status}`;

describe("store epochs", () => {
  // The store's history goes back (epoch A to B) to a head of 3 and new
  // sends take seqs 4 and 5 again, so the client's cursor 5 is not above
  // the head: only the epoch it sends shows that the cursor names other
  // envelopes. listen polls once without cursor and epoch, hands over the
  // new envelopes, keeps cursor and epoch B together, sends B from then
  // on, and reports the resync.
  test("listen resynchronises after the store's history went back", async () => {
    const dir = await mkdtemp(join(tmpdir(), "epoch-"));
    try {
      for (const id of ["m1", "m2", "m3", "m4", "m5"]) relay.add("laptop", id);
      const states: ConnectionState[] = [];
      const phone = new RelayClient({ url: relay.url, token: "t", onState: (s) => states.push(s), log: () => {} });
      const path = join(dir, "phone.cursor");
      const got: string[] = [];
      const stop = new AbortController();
      const done = phone.listen((e: Envelope) => void got.push(e.id), { cursorStore: new FileCursorStore(path), signal: stop.signal, wait: 2 });
      await eventually("m1 to m5", () => got.length === 5);
      await eventually("position 5 in epoch A saved", () => relay.requests.some((q) => q.epoch === A));
      assert.equal(await readFile(path, "utf8"), `5 ${A}\n`);

      relay.rollback(3, 3, B, [
        ["laptop", "n4"],
        ["laptop", "n5"],
      ]);
      await eventually("n4 and n5", () => got.length === 7);
      await eventually("a poll in epoch B", () => relay.requests.some((q) => q.epoch === B));
      stop.abort();
      await done;
      assert.deepEqual(got, ["m1", "m2", "m3", "m4", "m5", "n4", "n5"]);
      assert.equal(await readFile(path, "utf8"), `5 ${B}\n`);

      const reqs = relay.requests.map(show);
      assert.equal(reqs[0], "poll 0 - 0", "the first poll carries the cursor alone");
      const conflict = relay.requests.findIndex((q) => q.status === 409);
      assert.ok(conflict > 0 && conflict + 1 < reqs.length, reqs.join(", "));
      for (const q of relay.requests.slice(1, conflict)) assert.equal(q.epoch, A, show(q));
      assert.equal(reqs[conflict + 1], "poll - - 0", "the poll after the 409 carries neither cursor nor epoch");
      for (const q of relay.requests.slice(conflict + 2)) assert.equal(show(q), `poll 5 ${B} 0`);

      const resyncs = states.filter((s) => s.kind === "resynced");
      assert.equal(resyncs.length, 1);
      const r = resyncs[0]!;
      assert.ok(r.kind === "resynced" && r.cursor === 5 && r.epoch === B && r.error.cursorAhead && r.error.epoch === B, JSON.stringify(r));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  // A rollback that lost acknowledgements too hands envelopes over again
  // after the resync, and nothing is skipped; a position without an epoch
  // (saved before epochs) sends the cursor alone until an answer names one.
  test("a resync hands over again what the store forgot was acknowledged", async () => {
    for (const id of ["m1", "m2", "m3", "m4"]) relay.add("laptop", id);
    const store = new MemoryCursorStore(2);
    const phone = new RelayClient({ url: relay.url, token: "t", log: () => {} });
    const got: string[] = [];
    const stop = new AbortController();
    const done = phone.listen((e) => void got.push(e.id), { cursorStore: store, signal: stop.signal, wait: 2 });
    await eventually("m3 and m4", () => got.length === 2);
    relay.rollback(4, 1, B, [["laptop", "n5"]]);
    await eventually("four more", () => got.length === 6);
    stop.abort();
    await done;
    assert.deepEqual(got, ["m3", "m4", "m2", "m3", "m4", "n5"]);
    assert.deepEqual([store.cursor, store.epoch], [5, B]);
    assert.equal(show(relay.requests[0]!), "poll 2 - 0");
  });

  test("ack and poll carry the epoch given, and a stale one acknowledges nothing", async () => {
    relay.add("laptop", "m1");
    relay.add("laptop", "m2");
    const phone = new RelayClient({ url: relay.url, token: "t" });
    const reg = await phone.register();
    assert.equal(reg.epoch, A);
    const res = await phone.poll({ cursor: 0, epoch: A });
    assert.equal(res.epoch, A);
    assert.equal(res.envelopes.length, 2);
    await phone.ack(1, { epoch: res.epoch });
    relay.rollback(2, 0, B);
    const stale = (e: unknown) => e instanceof RelayError && e.cursorAhead && e.epoch === B && e.head === 2;
    await assert.rejects(phone.ack(2, { epoch: A }), stale);
    await assert.rejects(phone.poll({ cursor: 0, epoch: A }), stale);
    assert.equal(relay.cursor, 0, "a stale request acknowledged");
    assert.deepEqual(relay.requests.map(show), [`poll 0 ${A} 0`, `ack 1 ${A} 0`, `ack 2 ${A} 409`, `poll 0 ${A} 409`]);
  });
});
