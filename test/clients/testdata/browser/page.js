// Served by TestBrowserCORS from its own origin; the relay is on another.
// It uses the compiled client as an app would, then POSTs what happened to
// /result on its own origin.
const report = (result) =>
  fetch("/result", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(result) });

const refusal = async (call) => {
  try {
    await call();
    return { status: 0 };
  } catch (e) {
    return { name: e.name, status: e.status, code: e.code, limit: e.limit, retryAfter: e.retryAfter };
  }
};

try {
  const cfg = await (await fetch("/config.json")).json();
  const { RelayClient, MemoryCursorStore } = await import("/client/index.js");
  const signal = AbortSignal.timeout(cfg.timeoutMs);
  const phone = new RelayClient({ url: cfg.relay, token: cfg.phone });
  const laptop = new RelayClient({ url: cfg.relay, token: cfg.laptop });

  const registered = await phone.register({}, { signal });
  const sent = await laptop.send(["phone"], "hello from the browser", { signal });

  const got = [];
  const store = new MemoryCursorStore();
  const stop = new AbortController();
  signal.addEventListener("abort", () => stop.abort());
  await phone.listen(
    (e) => {
      got.push({ seq: e.seq, id: e.id, from: e.from, payload: new TextDecoder().decode(e.payload) });
      stop.abort();
    },
    { cursorStore: store, signal: stop.signal, wait: 5 },
  );

  // Refusals must be readable too: status, code, and Retry-After.
  const unknown = await refusal(() => laptop.send(["ghost"], "x"));
  const limited = await refusal(() => laptop.sendOnce(["phone"], "y", "limited-1"));
  const stranger = new RelayClient({ url: cfg.relay, token: "not.a.token" });
  const unauthorized = await refusal(() => stranger.poll());

  await report({ ok: got.length === 1, registered, sent, got, cursor: store.cursor, unknown, limited, unauthorized });
} catch (e) {
  await report({ ok: false, error: `${e?.name}: ${e?.message}` });
}
