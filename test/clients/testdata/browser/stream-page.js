// Served by TestBrowserStream from its own origin; the relay is on another.
// The phone listens as an app does (a stream, by default) while the laptop
// sends; the page reports what it received and the states it went through.
const report = (result) =>
  fetch("/result", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(result) });

try {
  const cfg = await (await fetch("/config.json")).json();
  const { RelayClient, MemoryCursorStore } = await import("/client/index.js");
  const states = [];
  let connected;
  const streaming = new Promise((resolve) => (connected = resolve));
  const phone = new RelayClient({
    url: cfg.relay,
    token: cfg.phone,
    onState: (s) => {
      states.push(s.kind + ("transport" in s ? `/${s.transport}` : ""));
      if (s.kind === "connected" && s.transport === "stream") connected();
    },
  });
  const laptop = new RelayClient({ url: cfg.relay, token: cfg.laptop });
  await phone.register();
  states.length = 0;

  const got = [];
  const store = new MemoryCursorStore();
  const stop = new AbortController();
  AbortSignal.timeout(cfg.timeoutMs).addEventListener("abort", () => stop.abort());
  const listening = phone.listen(
    (e) => {
      got.push({ seq: e.seq, payload: new TextDecoder().decode(e.payload) });
      if (got.length === cfg.count) stop.abort();
    },
    { cursorStore: store, signal: stop.signal },
  );
  await streaming;
  for (let i = 1; i <= cfg.count; i++) await laptop.send(["phone"], `m${i}`);
  await listening;
  await report({ ok: got.length === cfg.count, got, states, cursor: store.cursor });
} catch (e) {
  await report({ ok: false, error: `${e?.name}: ${e?.message}` });
}
