// Served by TestBrowserTabsRenew: pairs the browser once into
// localStorage, then opens two frames of this origin (two tabs, as far as
// localStorage and Web Locks go), each of which renews the same stored
// credentials in rounds at the same moments, and reports what both saw.
const report = (result) =>
  fetch("/result", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(result) });

try {
  const cfg = await (await fetch("/config.json")).json();
  const { LocalStorageCredentialStore, pair } = await import("/client/index.js");
  localStorage.clear();
  await pair(cfg.relay, cfg.code, { store: new LocalStorageCredentialStore("relay-tabs") });
  const done = [];
  const all = new Promise((resolve) => {
    addEventListener("message", (ev) => {
      if (ev.origin !== location.origin) return;
      done.push(ev.data);
      if (done.length === 2) resolve();
    });
  });
  // Both frames start their rounds at the same instants, so that they
  // find their sets due together.
  const start = Date.now() + 1500;
  for (const i of [0, 1]) {
    const f = document.createElement("iframe");
    f.src = `/index.html?run=/tab.js&tab=${i}&start=${start}&rounds=${cfg.rounds}`;
    document.body.append(f);
  }
  await all;
  const saved = JSON.parse(localStorage.getItem("relay-tabs"));
  await report({ ok: done.every((d) => d.ok), tabs: done, locks: typeof navigator.locks?.request === "function", saved: saved?.renewal_secret ?? "" });
} catch (e) {
  await report({ ok: false, error: `${e?.name}: ${e?.message}` });
}
