import { RelayError } from "./errors.js";

/**
 * The most of a Retry-After the client honours, in seconds, as the Go
 * client does (client.MaxRetryAfter). The relay asks for 1 to 5 s; more
 * comes from a misconfigured proxy, and waiting days for it would stop the
 * client as surely as a tight loop floods the relay.
 */
export const MAX_RETRY_AFTER_SECONDS = 60;

/**
 * The longest delay setTimeout takes: above it, browsers and Node fire
 * after about 1 ms, which turns a long wait into a tight loop.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** ms as a delay setTimeout honours: at most MAX_TIMER_MS. */
export function timerMs(ms: number): number {
  return Math.min(ms, MAX_TIMER_MS);
}

/**
 * The pause between retries the protocol asks for: at least Retry-After
 * (1 s when the answer had none, or there was no answer; never more than
 * MAX_RETRY_AFTER_SECONDS), doubled on each refusal in a row up to a cap,
 * plus a random extra of up to as much again so that refused clients do
 * not come back together.
 */
export class Backoff {
  private n = 0; // refusals in a row
  private readonly maxMs: number;
  constructor(maxMs: number) {
    this.maxMs = timerMs(maxMs);
  }

  next(err: unknown): number {
    let base = 1000;
    if (err instanceof RelayError && err.retryAfter !== undefined && err.retryAfter > 0) {
      base = Math.min(err.retryAfter, MAX_RETRY_AFTER_SECONDS) * 1000;
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

/** Waits ms (at most MAX_TIMER_MS), or until signal aborts (then resolves false). */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const done = (ok: boolean) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    const timer = setTimeout(() => done(true), timerMs(ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
