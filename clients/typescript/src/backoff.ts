import { RelayError } from "./errors.js";

/**
 * The pause between retries the protocol asks for: at least Retry-After
 * (1 s when the answer had none, or there was no answer), doubled on each
 * refusal in a row up to a cap, plus a random extra of up to as much again
 * so that refused clients do not come back together.
 */
export class Backoff {
  private n = 0; // refusals in a row
  constructor(private readonly maxMs: number) {}

  next(err: unknown): number {
    let base = 1000;
    if (err instanceof RelayError && err.retryAfter !== undefined && err.retryAfter > 0) {
      base = err.retryAfter * 1000;
    }
    let d = base;
    for (let i = 0; i < this.n && d < this.maxMs; i++) d *= 2;
    d = Math.min(d, this.maxMs);
    this.n++;
    d += Math.random() * d;
    // The cap holds with the extra too, but never below what the relay asked for.
    return Math.max(Math.min(d, this.maxMs), base);
  }

  reset(): void {
    this.n = 0;
  }
}

/** Waits ms, or until signal aborts (then resolves false). */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const done = (ok: boolean) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
