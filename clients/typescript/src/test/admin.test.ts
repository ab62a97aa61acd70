// An admin device's calls, against a relay that pairs devices (it holds
// the issuer's private key): invite, the directory, removeDevice.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { RelayClient, RelayError, pair } from "../index.js";
import { household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

let relay: Relay;
before(async () => {
  relay = await startRelay({}, { pairing: true });
});
after(async () => {
  await relay?.stop();
});

const status = (code: number) => (e: unknown) => e instanceof RelayError && e.status === code;

test("an admin invites a device, which pairs with the code and is listed; removed, its token is refused", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  await admin.register();

  const inv = await admin.invite("phone");
  assert.match(inv.code, /^[0-9A-Z]{5}-[0-9A-Z]{5}$/);
  assert.deepEqual([inv.household, inv.device, inv.scope], [hh, "phone", "device"]);
  assert.equal(inv.url, `${relay.url}/console/#pair=${inv.code}&household=${hh}`);
  assert.ok(Date.parse(inv.expires_at) > Date.now());

  const creds = await pair(relay.url, inv.code);
  assert.deepEqual([creds.household, creds.device, creds.scope], [hh, "phone", "device"]);
  // The code is spent.
  await assert.rejects(pair(relay.url, inv.code), status(401));

  const phone = new RelayClient({ url: relay.url, token: creds.access_token });
  await phone.register();
  const listed = (await admin.devices()).devices.map((d) => d.device);
  assert.deepEqual(listed, ["admin", "phone"]);

  // A device token may neither invite nor remove.
  await assert.rejects(phone.invite("tablet"), status(403));
  await assert.rejects(phone.removeDevice("admin"), status(403));

  await admin.removeDevice("phone");
  await assert.rejects(phone.register(), status(401));
  assert.deepEqual((await admin.devices()).devices.map((d) => d.device), ["admin"]);
  await assert.rejects(admin.removeDevice("phone"), status(404));
});

test("an admin invitation pairs a device of admin scope, which may invite in turn", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  const inv = await admin.invite("laptop", { scope: "admin" });
  assert.equal(inv.scope, "admin");
  const creds = await pair(relay.url, inv.code);
  assert.equal(creds.scope, "admin");
  const laptop = new RelayClient({ url: relay.url, token: creds.access_token });
  const next = await laptop.invite("watch");
  assert.equal(next.household, hh);
});

test("an invitation for a device in use is refused unless it replaces it; a pending one is listed and cancelled", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  await admin.register();
  const first = await pair(relay.url, (await admin.invite("phone")).code);
  await assert.rejects(admin.invite("phone"), (e: unknown) => e instanceof RelayError && e.status === 409 && e.code === "device_exists");

  const inv = await admin.invite("phone", { replace: true });
  assert.equal(inv.replace, true);
  const pending = (await admin.invitations()).invitations.filter((i) => i.redeemed_at === null);
  assert.deepEqual(pending.map((i) => [i.device, i.replace, i.created_by]), [["phone", true, "admin"]]);
  await admin.cancelInvitation("phone");
  await assert.rejects(pair(relay.url, inv.code), status(401));
  await assert.rejects(admin.cancelInvitation("phone"), status(404));

  // Replacing: the old device's token is refused, the new one's works.
  const again = await admin.invite("phone", { replace: true });
  const second = await pair(relay.url, again.code);
  await assert.rejects(new RelayClient({ url: relay.url, token: first.access_token }).register(), status(401));
  await new RelayClient({ url: relay.url, token: second.access_token }).register();
});
