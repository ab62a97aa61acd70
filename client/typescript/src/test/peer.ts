// One device of an interoperability test, the same code in Node
// (peer-main.ts) and in a browser (test/clients/testdata/browser/seal.js): it
// takes its identity from a seed, registers, seals and sends, then listens
// until it has opened what it expects. It imports only the client, no
// Node module.
import { Identity, Keyring, MemoryPinStore, RelayClient, SealError, SealedClient } from "../index.js";

export interface PeerJob {
  relay: string;
  token: string;
  /** The identity's seed, 64 hex digits. */
  seed: string;
  /** Sent before receiving, if given. */
  send?: { id: string; to: string[]; plaintext: string };
  /** How many envelopes to take (opened or refused) before reporting. */
  receive: number;
  timeoutMs: number;
}

export interface PeerResult {
  ok: boolean;
  error?: string;
  household?: string;
  device?: string;
  /** The identity's public key, hex. */
  publicKey?: string;
  sent?: { id: string; deliveries: { device: string; seq: number }[] };
  got: { id: string; from: string; plaintext: string }[];
  refused: { id: string; from: string; code: string }[];
}

function unhex(s: string): Uint8Array {
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}

function hex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

export async function runPeer(job: PeerJob): Promise<PeerResult> {
  const res: PeerResult = { ok: false, got: [], refused: [] };
  try {
    const signal = AbortSignal.timeout(job.timeoutMs);
    const identity = await Identity.fromSeed(unhex(job.seed));
    res.publicKey = hex(identity.publicKey);
    const client = new RelayClient({ url: job.relay, token: job.token });
    const me = await SealedClient.register(client, identity, await Keyring.load(new MemoryPinStore()), { signal });
    res.household = me.household;
    res.device = me.device;
    if (job.send) res.sent = await me.sendSealed(job.send.id, job.send.to, job.send.plaintext, { signal });
    if (job.receive > 0) {
      const stop = new AbortController();
      signal.addEventListener("abort", () => stop.abort());
      const taken = () => {
        if (res.got.length + res.refused.length >= job.receive) stop.abort();
      };
      await me.listen(
        (e) => {
          res.got.push({ id: e.id, from: e.from, plaintext: new TextDecoder().decode(e.plaintext) });
          taken();
        },
        {
          signal: stop.signal,
          wait: 5,
          onRefused: (e, err: SealError) => {
            res.refused.push({ id: e.id, from: e.from, code: err.code });
            taken();
          },
        },
      );
      if (signal.aborted) throw new Error(`took ${res.got.length + res.refused.length} of ${job.receive} envelopes within ${job.timeoutMs} ms`);
    }
    res.ok = true;
  } catch (e) {
    res.error = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  }
  return res;
}
