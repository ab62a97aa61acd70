// subscribeWebPush against a relay that sends Web Push: it fetches the
// relay's VAPID key, subscribes with it as applicationServerKey, and
// registers the subscription as the device's webpush target. The push
// manager is the one part that is not real here: a browser's subscribes
// at its vendor's push service, which this machine cannot reach (the
// Chromium test, test/clients/browser_test.go, starts at the browser's side of
// a push instead). The stand-in gives a subscription of a real P-256 key.
import assert from "node:assert/strict";
import { randomBytes, webcrypto } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { RelayClient, RelayError, subscribeWebPush } from "../index.js";
import type { PushRegistration, PushSubscriptionLike } from "../index.js";
import { household, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

let relay: Relay;
let plain: Relay;
before(async () => {
  relay = await startRelay({ FN_VAPID_SUBJECT: "mailto:ops@relay.example", FN_VAPID_KEY_FILE: join(tmpdir(), `vapid-${randomBytes(6).toString("hex")}.key`) });
  plain = await startRelay();
});
after(async () => {
  await relay?.stop();
  await plain?.stop();
});

const b64url = (b: Uint8Array) => Buffer.from(b).toString("base64url");

async function subscription(endpoint: string, serverKey: ArrayBuffer | null): Promise<PushSubscriptionLike & { unsubscribed: boolean }> {
  const pair = (await webcrypto.subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, true, ["deriveBits"])) as CryptoKeyPair;
  const p256dh = new Uint8Array(await webcrypto.subtle.exportKey("raw", pair.publicKey));
  const s = {
    unsubscribed: false,
    options: { applicationServerKey: serverKey },
    toJSON: () => ({ endpoint, expirationTime: null, keys: { p256dh: b64url(p256dh), auth: b64url(randomBytes(16)) } }),
    unsubscribe: async () => {
      s.unsubscribed = true;
      return true;
    },
  };
  return s;
}

test("subscribeWebPush subscribes with the relay's VAPID key and registers the subscription", async () => {
  const hh = household();
  const client = new RelayClient({ url: relay.url, token: await relay.token(hh, "browser") });
  const key = await client.vapidKey();
  assert.match(key, /^B[A-Za-z0-9_-]{86}$/);

  let asked: ArrayBuffer | undefined;
  let current: PushSubscriptionLike | null = await subscription("https://93.184.216.34/push/old", new Uint8Array(65).buffer);
  const old = current as PushSubscriptionLike & { unsubscribed: boolean };
  const reg: PushRegistration = {
    pushManager: {
      getSubscription: async () => current,
      subscribe: async (o) => {
        asked = o.applicationServerKey;
        assert.equal(o.userVisibleOnly, true);
        current = await subscription("https://93.184.216.34/push/new", o.applicationServerKey);
        return current;
      },
    },
  };
  const json = await subscribeWebPush(client, reg);
  assert.equal(old.unsubscribed, true, "a subscription made with another key is dropped");
  assert.equal(b64url(new Uint8Array(asked!)), key, "subscribed with the relay's key");
  assert.equal(json.endpoint, "https://93.184.216.34/push/new");
  const dev = (await client.devices()).devices.find((d) => d.device === "browser");
  assert.equal(dev?.push_kind, "webpush");

  // Subscribed with the relay's key already: kept, registered again.
  asked = undefined;
  await subscribeWebPush(client, reg);
  assert.equal(asked, undefined, "an up-to-date subscription is not made again");
});

test("a relay that sends no Web Push answers vapidKey with 404", async () => {
  const client = new RelayClient({ url: plain.url, token: await plain.token(household(), "browser") });
  await assert.rejects(client.vapidKey(), (e: unknown) => e instanceof RelayError && e.status === 404);
});
