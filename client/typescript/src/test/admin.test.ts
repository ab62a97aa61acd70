// An admin device's calls, against a relay that pairs devices (it holds
// the issuer's private key): invite, the directory, removeDevice; and the
// command line's pair, which redeems an admin's invitation.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import { decodeBase64 } from "../base64.js";
import { MemoryCredentialStore, RelayClient, RelayError, RenewingCredentials, fingerprint, pair } from "../index.js";
import { loadIdentity } from "../node.js";
import { cliPath, eventually, household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

let relay: Relay;
before(async () => {
  // The tests together pair and renew more than the default 10 times a minute from one address.
  relay = await startRelay({ FN_PAIR_RATE_PER_ADDRESS: "100" }, { pairing: true });
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
  assert.equal(inv.url, `${relay.url}/pair/#code=${inv.code}&household=${hh}`);
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

test("the command line's pair -identity publishes the device's key and prints its fingerprint, the one the inviting admin sees", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  const dir = await mkdtemp(join(tmpdir(), "pair-identity-"));
  const cli = (...args: string[]) => promisify(execFile)(process.execPath, [cliPath, ...args], { env: { PATH: process.env.PATH ?? "" } });
  try {
    const identityFile = join(dir, "phone.seed");
    const { stdout } = await cli("pair", "-url", relay.url, "-code", (await admin.invite("phone")).code, "-store", join(dir, "phone.json"), "-identity", identityFile);
    assert.match(stdout, /^paired as device "phone" of household "hh-/);
    const printed = /^fingerprint: ((?:\d{5} ){5}\d{5})$/m.exec(stdout)?.[1];
    assert.ok(printed, `no fingerprint in ${JSON.stringify(stdout)}`);
    // The file is the device's identity, made 0600: its key is the one printed.
    assert.equal((await stat(identityFile)).mode & 0o777, 0o600);
    const { identity } = await loadIdentity(identityFile);
    assert.equal(await fingerprint(identity.publicKey), printed);
    // The admin's list shows the same digits beside the device, and so does the directory.
    const listed = (await admin.invitations()).invitations.find((i) => i.device === "phone");
    assert.ok(listed?.identity_key, "the invitation shows no key");
    assert.equal(await fingerprint(decodeBase64(listed.identity_key)), printed);
    const device = (await admin.devices()).devices.find((d) => d.device === "phone");
    assert.equal(device?.identity_key && (await fingerprint(decodeBase64(device.identity_key))), printed);
    // An existing identity file is kept: pairing again (replacing) gives the same key.
    const again = await cli("pair", "-url", relay.url, "-code", (await admin.invite("phone", { replace: true })).code, "-store", join(dir, "phone2.json"), "-identity", identityFile);
    assert.match(again.stdout, new RegExp(`^fingerprint: ${printed}$`, "m"));
    await assert.rejects(cli("pair", "-url", relay.url, "-code", "X", "-store", join(dir, "x.json"), "-identity"), (e: { code?: number }) => e.code === 2);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the command line says what to do when the relay refuses a device for good", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  const dir = await mkdtemp(join(tmpdir(), "pair-refused-"));
  const cli = async (...args: string[]) => {
    try {
      await promisify(execFile)(process.execPath, [cliPath, ...args], { env: { PATH: process.env.PATH ?? "" } });
      return { code: 0, stderr: "" };
    } catch (e) {
      const { code, stderr } = e as { code: number; stderr: string };
      return { code, stderr };
    }
  };
  try {
    const file = join(dir, "phone.json");
    const code = (await admin.invite("phone")).code;
    assert.equal((await cli("pair", "-url", relay.url, "-code", code, "-store", file)).code, 0);
    // A used code.
    let r = await cli("pair", "-url", relay.url, "-code", code, "-store", join(dir, "again.json"));
    assert.equal(r.code, 1, r.stderr);
    assert.ok(r.stderr.endsWith("ask an admin for a new invitation (relay invite -device NAME)\n"), r.stderr);

    // A removed device: its listener ends with the commands that pair it again.
    const tablet = await relay.token(hh, "tablet");
    await new RelayClient({ url: relay.url, token: tablet }).register();
    const paired = JSON.parse(await readFile(file, "utf8")) as { access_token: string };
    await new RelayClient({ url: relay.url, token: paired.access_token }).register();
    await admin.removeDevice("phone");
    await admin.removeDevice("tablet");
    r = await cli("listen", "-store", file, "-wait", "1");
    assert.equal(r.code, 1, r.stderr);
    // The invitation relay remove names (no -replace: the device is gone).
    assert.ok(r.stderr.endsWith(`ask an admin for a new invitation and pair again (relay invite -household ${hh} -device phone, then relay-client pair -url ${relay.url} -code CODE -store ${file}; if relay devices still lists phone, invite with -replace)\n`), r.stderr);
    // A removed device's token: token check asks the relay why.
    r = await cli("listen", "-url", relay.url, "-token", tablet, "-wait", "1");
    assert.equal(r.code, 1, r.stderr);
    assert.ok(r.stderr.endsWith(`; relay token check -url ${relay.url} TOKEN says why\n`), r.stderr);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// A stream's acknowledgement refused because its device was removed is
// logged with the refusal's own words last, so that the line ends with the
// step that helps, as the Go client's does. Seen red when the line ended
// "pair again (the next stream's cursor does)".
test("listen logs a refused acknowledgement with the refusal's next step last", async () => {
  const hh = household();
  const admin = new RelayClient({ url: relay.url, token: await relay.token(hh, "admin", "admin") });
  const store = new MemoryCredentialStore();
  await pair(relay.url, (await admin.invite("phone")).code, { store });
  const lines: string[] = [];
  const phone = new RelayClient({ url: relay.url, credentials: await RenewingCredentials.open(relay.url, store), log: (l) => lines.push(l) });
  await phone.register();
  const laptop = new RelayClient({ url: relay.url, token: await relay.token(hh, "laptop") });
  await laptop.send(["phone"], "one");
  let got = 0;
  const stop = new AbortController();
  const done = phone.listen(() => void got++, { signal: stop.signal }).catch(() => {}); // ends refused
  try {
    await eventually("the envelope", () => got === 1); // handed over, not yet acknowledged
    // The removal ends the stream, whose end acknowledges.
    await admin.removeDevice("phone");
    await eventually("the acknowledgement's line", () => lines.some((l) => l.includes("acknowledg")), 15_000);
  } finally {
    stop.abort();
    await done;
  }
  const line = lines.find((l) => l.includes("acknowledg"))!;
  const start = "listen: could not acknowledge 1 (the next stream's cursor will): ";
  assert.ok(line.startsWith(start) && line.endsWith("ask an admin for a new invitation and pair again"), `the acknowledgement's line ${JSON.stringify(line)}; all lines:\n${lines.join("\n")}`);
});
