// Served by TestBrowserPushWorker: two devices of one household, phone (this
// browser) and laptop, with identities in the directory; laptop seals an
// envelope to phone and sends it. The page then registers the client docs'
// push worker (/push-worker.js, a module worker), gives it phone's device,
// and watches for the notification the worker shows when a push arrives.
try {
  const cfg = await (await fetch("/config.json")).json();
  const { Identity, RelayClient, seal } = await import("/client/index.js");
  const b64 = (u) => btoa(String.fromCharCode(...u));
  const phoneId = await Identity.generate();
  const laptopId = await Identity.generate();
  const phone = new RelayClient({ url: cfg.relay, token: cfg.phone });
  const laptop = new RelayClient({ url: cfg.relay, token: cfg.laptop });
  await phone.register({ identity_key: b64(phoneId.publicKey) });
  await laptop.register({ identity_key: b64(laptopId.publicKey) });
  const id = "sealed-1";
  const sealed = await seal(
    { household: "home", id, sender: "laptop", identity: laptopId, recipients: [{ device: "phone", key: phoneId.publicKey }] },
    new TextEncoder().encode(cfg.plaintext),
  );
  await laptop.sendOnce(["phone"], sealed, id);

  const reg = await navigator.serviceWorker.register("/push-worker.js", { type: "module" });
  const ready = await navigator.serviceWorker.ready;
  const saved = new Promise((resolve) => navigator.serviceWorker.addEventListener("message", (ev) => ev.data?.type === "relay-device-saved" && resolve()));
  ready.active.postMessage({
    type: "relay-device",
    device: { relay: cfg.relay, household: "home", device: "phone", token: cfg.phone, seed: b64(phoneId.seed), pins: { laptop: b64(laptopId.publicKey) } },
  });
  await saved;
  window.pushReady = true;
  for (;;) {
    const shown = await reg.getNotifications();
    if (shown.length > 0) {
      window.shown = shown.map((n) => ({ title: n.title, body: n.body }));
      break;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
} catch (e) {
  window.pushError = `${e?.name}: ${e?.message}`;
}
