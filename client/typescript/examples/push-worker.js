// A service worker that shows a browser device's envelopes while its page
// is closed: the relay's Web Push wakes it (the push carries nothing), it
// polls once, opens the sealed envelopes with the device's identity and
// shows the newest as a notification, and acknowledges what it showed.
//
// The page registers it as a module worker and tells it the device once:
//
//   const reg = await navigator.serviceWorker.register("/push-worker.js", { type: "module" });
//   await subscribeWebPush(client, reg);
//   (await navigator.serviceWorker.ready).active.postMessage({ type: "relay-device", device: {
//     relay, household, device, token, seed, pins } });  // seed and pins: base64
//
// A real app renews the token here as the page does (RenewingCredentials
// over a store both can read); this example keeps what the page gave it.
import { Identity, RelayClient, open, subscribeWebPush } from "@flamenet/relay-client";

const CACHE = "relay-device";
const KEY = "/relay-device.json";

const b64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));

async function load() {
  const r = await (await caches.open(CACHE)).match(KEY);
  return r ? r.json() : undefined;
}

async function save(device) {
  await (await caches.open(CACHE)).put(KEY, new Response(JSON.stringify(device), { headers: { "Content-Type": "application/json" } }));
}

self.addEventListener("message", (ev) => {
  if (ev.data?.type === "relay-device") ev.waitUntil(save(ev.data.device).then(() => ev.source?.postMessage({ type: "relay-device-saved" })));
});

self.addEventListener("push", (ev) => ev.waitUntil(showEnvelopes()));

// The browser replaced the subscription (or dropped it): subscribe again
// and tell the relay, or the device is woken no more.
self.addEventListener("pushsubscriptionchange", (ev) =>
  ev.waitUntil(
    load().then((d) => d && subscribeWebPush(new RelayClient({ url: d.relay, token: d.token }), self.registration)),
  ),
);

async function showEnvelopes() {
  const d = await load();
  if (!d) return self.registration.showNotification("New message");
  try {
    const client = new RelayClient({ url: d.relay, token: d.token });
    const identity = await Identity.fromSeed(b64(d.seed));
    const pins = Object.fromEntries(Object.entries(d.pins).map(([k, v]) => [k, b64(v)]));
    const got = await client.poll({ cursor: d.cursor ?? 0, epoch: d.epoch, wait: 0, limit: 5 });
    const texts = [];
    for (const e of got.envelopes) {
      const plain = await open(e.payload, { household: d.household, id: e.id, from: e.from, device: d.device, identity, pinned: (dev) => pins[dev] });
      texts.push({ from: e.from, text: new TextDecoder().decode(plain) });
    }
    if (texts.length === 0) return;
    const last = texts[texts.length - 1];
    await self.registration.showNotification(`From ${last.from}`, { body: last.text, tag: "relay", data: { count: texts.length } });
    // Acknowledged only once shown: what was not shown stays for the page.
    await client.ack(got.cursor, { epoch: got.epoch });
    await save({ ...d, cursor: got.cursor, epoch: got.epoch });
  } catch {
    await self.registration.showNotification("New message");
  }
}
