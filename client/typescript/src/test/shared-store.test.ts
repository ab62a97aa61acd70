// Two holders of one credential store (two tabs of one origin, two parts
// of one app) renew in turn and at once against a relay that pairs: the
// second takes up the set the first saved instead of presenting the spent
// secret, which the relay would take as reuse and answer by revoking the
// device's every secret.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { MemoryCredentialStore, RelayClient, RenewingCredentials, pair } from "../index.js";
import { household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

let relay: Relay;
before(async () => {
  relay = await startRelay({}, { pairing: true });
});
after(async () => {
  await relay?.stop();
});

test("two holders of one store renew one at a time and keep working", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  const store = new MemoryCredentialStore();
  await pair(relay.url, (await admin.invite("phone")).code, { store });
  const a = await RenewingCredentials.open(relay.url, store);
  const b = await RenewingCredentials.open(relay.url, store);

  for (let round = 0; round < 4; round++) {
    const [first, second] = round % 2 === 0 ? [a, b] : [b, a];
    await first.refused(await first.token()); // renews
    const tok = await second.refused(await second.token()); // finds the set renewed
    assert.equal(tok, first.credentials.access_token, `round ${round}: the second holder took up the first's set`);
  }
  for (let round = 0; round < 4; round++) {
    const [ta, tb] = [await a.token(), await b.token()];
    await Promise.all([a.refused(ta), b.refused(tb)]);
    assert.equal(a.credentials.renewal_secret, b.credentials.renewal_secret, `concurrent round ${round}: one set`);
  }
  // Both still work: their set is the live one.
  for (const src of [a, b]) await new RelayClient({ url: relay.url, credentials: src }).register();
  assert.equal((await store.load())?.renewal_secret, a.credentials.renewal_secret);
});
