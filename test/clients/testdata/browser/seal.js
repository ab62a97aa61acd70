// Served by the sealed-envelope tests (seal_test.go) from their own origin:
// one interoperability peer in the browser (dist/test/peer.js, on
// WebCrypto's Ed25519, X25519 and AES-GCM), and the keyring's localStorage
// store, then POSTs what happened to /result.
const report = (result) =>
  fetch("/result", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(result) });

try {
  const job = await (await fetch("/job.json")).json();
  const { runPeer } = await import("/client/test/peer.js");
  const { Keyring, LocalStoragePinStore, Identity } = await import("/client/index.js");
  const result = await runPeer(job);

  // Pins in localStorage outlive the keyring that wrote them.
  const item = `pins-${crypto.randomUUID()}`;
  const key = (await Identity.generate()).publicKey;
  const k = await Keyring.load(new LocalStoragePinStore(item));
  await k.see("laptop", key);
  const again = await Keyring.load(new LocalStoragePinStore(item));
  const pinned = again.pinned("laptop");
  result.localStorage = pinned !== undefined && pinned.every((b, i) => b === key[i]) && localStorage.getItem(item)?.includes('"laptop"') === true;
  localStorage.removeItem(item);

  await report(result);
} catch (e) {
  await report({ ok: false, error: `${e?.name}: ${e?.message}`, got: [], refused: [] });
}
