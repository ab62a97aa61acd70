// One "tab" of tabs.js: opens the stored credentials and renews them once
// a round, each round at a set instant shared with the other tab, then
// registers with the token it holds, and tells the page how it went.
const q = new URLSearchParams(location.search);
const tab = Number(q.get("tab"));
const start = Number(q.get("start"));
const rounds = Number(q.get("rounds"));
const tell = (msg) => parent.postMessage({ tab, ...msg }, location.origin);
try {
  const cfg = await (await fetch("/config.json")).json();
  const { LocalStorageCredentialStore, RelayClient, RenewingCredentials } = await import("/client/index.js");
  const creds = await RenewingCredentials.open(cfg.relay, new LocalStorageCredentialStore("relay-tabs"));
  const client = new RelayClient({ url: cfg.relay, credentials: creds });
  for (let r = 0; r < rounds; r++) {
    const at = start + r * 400;
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, at - Date.now())));
    // As after a 401: this tab's token is taken for refused, so it renews
    // unless the store holds a set the other tab renewed meanwhile.
    await creds.refused(await creds.token());
  }
  await client.register();
  tell({ ok: true, secret: creds.credentials.renewal_secret });
} catch (e) {
  tell({ ok: false, error: `${e?.name}: ${e?.message}` });
}
