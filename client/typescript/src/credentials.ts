// Where the client's bearer token comes from: a fixed token, or a paired
// device's credentials, renewed before they expire and saved in a store
// the app provides before they are used (docs/PROTOCOL.md, pairing).
import { decodeBase64, encodeBase64 } from "./base64.js";
import { answerError, readAnswer } from "./client.js";
import { timerMs } from "./backoff.js";
import { NoAnswerError, RelayError, abortError } from "./errors.js";

/** Gives the client the bearer token of each request. */
export interface CredentialSource {
  /** The access token to send now (renewed first when due). */
  token(signal?: AbortSignal): Promise<string>;
  /**
   * The relay answered 401 to tok: resolves to a token to make the call
   * with once more, or rejects (with an UnauthorizedError when no renewal
   * can help).
   */
  refused(tok: string, signal?: AbortSignal): Promise<string>;
  /**
   * Whether the next token() renews. A stream is authorized once, when it
   * opens: listen ends one whose token is due (it asks at each event; the
   * relay pings at least every 25 s) and opens the next, renewing, so
   * that a device that only streams renews before its token expires.
   */
  due?(): boolean;
}

/**
 * The device's renewal (or pairing) was refused: it must be paired again,
 * which its message says. It is a RelayError of status 401, as the
 * relay's refusal of a token is, so that `e instanceof RelayError &&
 * e.status === 401` is the one test an app needs; `cause` is the relay's
 * answer to the renewal.
 */
export class UnauthorizedError extends RelayError {
  constructor(message: string, cause?: unknown) {
    super(401, { error: "unauthorized", message }, undefined);
    if (cause !== undefined) Object.defineProperty(this, "cause", { value: cause });
  }
}

/** A fixed token: a 401 is final. */
export class FixedToken implements CredentialSource {
  constructor(private readonly value: string) {}
  async token(): Promise<string> {
    return this.value;
  }
  async refused(): Promise<string> {
    throw new UnauthorizedError("the token is refused");
  }
}

/** What pairing and each renewal return (POST /v1/pair, /v1/renew), as a store keeps it. */
export interface Credentials {
  /** The relay's base URL, kept with the credentials (not part of the answer). */
  url?: string;
  household: string;
  device: string;
  scope: string;
  access_token: string;
  /** RFC 3339. */
  access_expires_at: string;
  renewal_secret: string;
  /** RFC 3339. */
  renewal_expires_at: string;
}

/**
 * Keeps a device's credentials. A renewal makes the old renewal secret
 * useless, so each new set is saved before it is used: save must be
 * durable when it resolves.
 */
export interface CredentialStore {
  /** The saved credentials, undefined when none were saved. */
  load(): Promise<Credentials | undefined>;
  save(c: Credentials): Promise<void>;
  /**
   * Runs fn while no other holder of this store (another tab, another
   * RenewingCredentials) runs one: RenewingCredentials renews inside it
   * and reads the store first, so that a set another holder renewed is
   * taken up rather than renewed again. Presenting a secret another holder
   * spent would revoke every secret of the device. Optional: a store only
   * one holder uses needs none.
   */
  exclusive?<T>(fn: () => Promise<T>): Promise<T>;
}

/** One holder at a time, within this JavaScript realm. */
class Mutex {
  private tail: Promise<unknown> = Promise.resolve();
  run<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.tail.then(fn, fn);
    this.tail = next.catch(() => {});
    return next;
  }
}

/** Credentials in memory: for tests, and apps that keep them elsewhere. Holders of one store renew one at a time. */
export class MemoryCredentialStore implements CredentialStore {
  private c: Credentials | undefined;
  private readonly mutex = new Mutex();
  constructor(initial?: Credentials) {
    this.c = initial;
  }
  async load(): Promise<Credentials | undefined> {
    return this.c && { ...this.c };
  }
  async save(c: Credentials): Promise<void> {
    this.c = { ...c };
  }
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return this.mutex.run(fn);
  }
}

/** The part of the Web Locks API (navigator.locks) that LocalStorageCredentialStore uses. */
export interface LockManagerLike {
  request<T>(name: string, callback: () => Promise<T>): Promise<T>;
}

/** The part of the browser's Storage that LocalStorageCredentialStore uses. */
export interface KeyValueStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

/**
 * Credentials in the browser's localStorage (or any Storage), as JSON
 * under one key. localStorage is readable by every script of the page's
 * origin: serve the app from an origin of its own.
 */
export class LocalStorageCredentialStore implements CredentialStore {
  private readonly storage: KeyValueStorage;
  private readonly locks: LockManagerLike | undefined;
  private readonly mutex = new Mutex();
  /**
   * locks defaults to the browser's navigator.locks, which every tab of the
   * origin shares: tabs renew one at a time. Without it, holders in this
   * realm still do.
   */
  constructor(
    readonly key = "relay-credentials",
    storage?: KeyValueStorage,
    locks?: LockManagerLike,
  ) {
    const s = storage ?? (globalThis as { localStorage?: KeyValueStorage }).localStorage;
    if (!s) throw new Error("relay client: no localStorage here; pass a storage");
    this.storage = s;
    this.locks = locks ?? (globalThis as { navigator?: { locks?: LockManagerLike } }).navigator?.locks;
  }
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return this.locks ? this.locks.request(`relay-credentials:${this.key}`, fn) : this.mutex.run(fn);
  }
  async load(): Promise<Credentials | undefined> {
    const v = this.storage.getItem(this.key);
    return v === null ? undefined : (JSON.parse(v) as Credentials);
  }
  async save(c: Credentials): Promise<void> {
    // setItem throws when the storage is full: the set is then not used.
    this.storage.setItem(this.key, JSON.stringify(c));
  }
}

export interface RenewingOptions {
  /** The fetch to use; the platform's by default. */
  fetch?: typeof fetch;
  /** Bound of each renewal (default 30 s). */
  requestTimeoutMs?: number;
  /** The clock, in ms since the epoch (default Date.now); tests drive it. */
  now?: () => number;
}

/**
 * How long after a renewal that failed for a passing reason (no answer,
 * 429, 5xx) the next is tried, while the access token still works.
 */
const RENEW_PAUSE_MS = 5_000;
const MOST_LEAD_MS = 5 * 60_000;

/**
 * A paired device's credentials, renewed at POST /v1/renew when less than
 * a third of the access token's life is left (or 5 minutes, whichever is
 * less) and when the relay refuses the token, each new set saved in the
 * store before it is used. Concurrent calls that find a renewal due wait
 * for one renewal. Once a renewal is refused (the secret was used
 * elsewhere, expired, or the device was removed) every call rejects with
 * an UnauthorizedError.
 */
export class RenewingCredentials implements CredentialSource {
  private flight: Promise<void> | undefined;
  private finalError: UnauthorizedError | undefined;
  private lastError: unknown;
  private retryAt = 0;
  private lead: number;
  // When this process received cur, by its own clock, and the token's
  // life: a clock ahead of the relay's would otherwise find each new token
  // due at once. 0 for credentials loaded from the store.
  private obtained = 0;
  private life = 0;
  private readonly fetchFn: typeof fetch;
  private readonly timeoutMs: number;
  private readonly now: () => number;

  private constructor(
    readonly url: string,
    private readonly store: CredentialStore,
    private cur: Credentials,
    opts: RenewingOptions,
  ) {
    this.fetchFn = opts.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.timeoutMs = opts.requestTimeoutMs ?? 30_000;
    this.now = opts.now ?? Date.now;
    this.lead = renewLead(cur);
  }

  /** A source of the credentials saved in store (as pair saves them), renewed at the relay at url. */
  static async open(url: string, store: CredentialStore, opts: RenewingOptions = {}): Promise<RenewingCredentials> {
    const c = await store.load();
    if (!c) throw new Error("relay client: no credentials saved; pair first");
    checkCredentials(c);
    return new RenewingCredentials(url.replace(/\/+$/, ""), store, c, opts);
  }

  /** The current set. */
  get credentials(): Credentials {
    return { ...this.cur };
  }

  token(signal?: AbortSignal): Promise<string> {
    return this.fresh(undefined, signal);
  }

  refused(tok: string, signal?: AbortSignal): Promise<string> {
    return this.fresh(tok, signal);
  }

  /** Whether the next token() renews: due, and no renewal failed a moment ago. */
  due(): boolean {
    const now = this.now();
    return this.finalError === undefined && now >= this.renewAt() && now >= this.retryAt;
  }

  private renewAt(): number {
    const end = this.obtained && this.life > 0 ? this.obtained + this.life : Date.parse(this.cur.access_expires_at);
    return end - this.lead;
  }

  private async fresh(refusedTok: string | undefined, signal: AbortSignal | undefined): Promise<string> {
    let renewed = false; // by this call, or by one it waited for: at most one per call
    for (;;) {
      if (this.finalError) throw this.finalError;
      if (this.flight) {
        // Another call is renewing: wait for it and look again.
        const ok = await this.flight.then(
          () => true,
          () => false,
        );
        renewed = ok;
        continue;
      }
      const now = this.now();
      const refused = refusedTok !== undefined && this.cur.access_token === refusedTok;
      const due = !renewed && (refused || now >= this.renewAt());
      if (!due) return this.cur.access_token;
      if (now < this.retryAt) {
        // A renewal failed a moment ago for a passing reason: the token
        // that still works is used meanwhile.
        if (refused || now >= Date.parse(this.cur.access_expires_at)) throw this.lastError;
        return this.cur.access_token;
      }
      const flight = this.renew(this.cur.renewal_secret, signal);
      this.flight = flight;
      try {
        await flight;
        renewed = true;
      } catch (e) {
        if (e instanceof RelayError && !e.temporary) {
          this.finalError = renewalRefused(e);
        } else if (signal?.aborted) {
          throw e; // this caller gave up; a waiter with time left renews
        } else {
          this.lastError = e;
          this.retryAt = now + RENEW_PAUSE_MS;
        }
      } finally {
        this.flight = undefined;
      }
    }
  }

  /**
   * Exchanges secret for a new set, saves it, and only then makes it
   * current: the relay has marked secret used, so a set not saved would be
   * lost with the process. When save fails the set is dropped; renewing
   * again with the old secret within 30 s is a retry the relay answers
   * with a fresh set, once. Runs in the store's exclusive section, after
   * reading the store: a set another holder saved is taken up instead.
   */
  private renew(secret: string, signal: AbortSignal | undefined): Promise<void> {
    const run = async () => {
      if (await this.adoptSaved(secret)) return;
      try {
        await this.exchange(secret, signal);
      } catch (e) {
        // A holder that renewed outside the store's lock may have spent
        // secret: its set, if saved, is taken up.
        if (e instanceof RelayError && !e.temporary && (await this.adoptSaved(secret))) return;
        throw e;
      }
    };
    return this.store.exclusive ? this.store.exclusive(run) : run();
  }

  /** Makes current the saved set if it is another than secret's (another holder renewed), and says so. */
  private async adoptSaved(secret: string): Promise<boolean> {
    let c: Credentials | undefined;
    try {
      c = await this.store.load();
      if (!c || c.renewal_secret === secret) return false;
      checkCredentials(c);
    } catch {
      return false;
    }
    this.cur = c;
    this.lead = renewLead(c);
    this.obtained = 0;
    this.life = 0;
    return true;
  }

  private async exchange(secret: string, signal: AbortSignal | undefined): Promise<void> {
    const c = await postJSON<Credentials>(this.fetchFn, this.url + "/v1/renew", { renewal_secret: secret }, this.timeoutMs, signal);
    checkCredentials(c);
    if (this.cur.url !== undefined) c.url = this.cur.url;
    await this.store.save(c);
    this.cur = c;
    this.lead = renewLead(c);
    this.obtained = this.now();
    this.life = tokenLife(c);
  }
}

export interface PairOptions {
  /** The device's Ed25519 public key (32 bytes, or their base64). */
  identityKey?: Uint8Array | string;
  /** Receives the credentials before pair resolves. */
  store?: CredentialStore;
  /**
   * The only scope the caller can use: a code of another scope is
   * refused like a wrong code (401) and stays unspent, so that a console
   * never spends an app device's code.
   */
  scope?: "device" | "admin";
  fetch?: typeof fetch;
  /** Bound of the request (default 30 s). */
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

/**
 * The final error of a renewal the relay refused. The relay gives one 401
 * for every cause, so the error names them and the one step that helps
 * with each: a new invitation.
 */
function renewalRefused(e: RelayError): UnauthorizedError {
  if (e.status !== 401) return new UnauthorizedError(`renewal refused (${e.message})`, e);
  return new UnauthorizedError(
    `renewal refused (${e.message}): this device's pairing was removed, or its renewal secret expired or was used by another copy of it; ask an admin for a new invitation and pair again`,
    e,
  );
}

/**
 * Redeems an invitation's code at the relay at url (POST /v1/pair, no
 * token needed), saves the credentials in opts.store and resolves to
 * them. A wrong, used or expired code rejects with an UnauthorizedError (a
 * RelayError of status 401) that says to ask for a new invitation.
 * RenewingCredentials.open(url, store) then keeps them fresh.
 */
export async function pair(url: string, code: string, opts: PairOptions = {}): Promise<Credentials> {
  const base = url.replace(/\/+$/, "");
  if (!/^https?:\/\/[^/]/.test(base)) throw new Error(`relay client: URL ${JSON.stringify(url)} is not http:// or https://`);
  if (!code.trim()) throw new Error("relay client: no pairing code");
  const body: { code: string; identity_key?: string; scope?: string } = { code };
  if (opts.scope !== undefined) body.scope = opts.scope;
  if (opts.identityKey !== undefined) {
    const k = typeof opts.identityKey === "string" ? opts.identityKey : encodeBase64(opts.identityKey);
    body.identity_key = k;
  }
  const fetchFn = opts.fetch ?? ((input, init) => globalThis.fetch(input, init));
  let c: Credentials;
  try {
    c = await postJSON<Credentials>(fetchFn, base + "/v1/pair", body, opts.requestTimeoutMs ?? 30_000, opts.signal);
  } catch (e) {
    // The relay gives one 401 for every cause; each needs a new invitation.
    if (e instanceof RelayError && e.status === 401) {
      throw new UnauthorizedError(`pairing refused (${e.message}): the code is wrong, used, expired or cancelled; ask an admin for a new invitation`, e);
    }
    throw e;
  }
  checkCredentials(c);
  c.url = base;
  await opts.store?.save(c);
  return c;
}

function checkCredentials(c: Credentials): void {
  if (!c || typeof c.access_token !== "string" || !c.access_token || typeof c.renewal_secret !== "string" || !c.renewal_secret || Number.isNaN(Date.parse(c.access_expires_at))) {
    throw new Error("relay client: credentials without an access token, a renewal secret or an expiry");
  }
}

/**
 * A third of the access token's life, or 5 minutes, whichever is less;
 * the life is read from the token's iat and exp (both the relay's clock).
 */
function renewLead(c: Credentials): number {
  const life = tokenLife(c);
  return life > 0 ? Math.min(life / 3, MOST_LEAD_MS) : MOST_LEAD_MS;
}

/** The JWT's exp less its iat in ms, read without checking it; 0 when unknown. */
function tokenLife(c: Credentials): number {
  const parts = c.access_token.split(".");
  if (parts.length !== 3) return 0;
  try {
    const claims = JSON.parse(new TextDecoder().decode(decodeBase64URL(parts[1]!))) as { iat?: unknown; exp?: unknown };
    if (typeof claims.iat !== "number" || typeof claims.exp !== "number" || claims.exp <= claims.iat) return 0;
    return (claims.exp - claims.iat) * 1000;
  } catch {
    return 0;
  }
}

function decodeBase64URL(s: string): Uint8Array {
  const std = s.replace(/-/g, "+").replace(/_/g, "/");
  return decodeBase64(std + "=".repeat((4 - (std.length % 4)) % 4));
}

/** POSTs in as JSON; resolves to a 200's JSON, rejects with RelayError or NoAnswerError. */
async function postJSON<T>(fetchFn: typeof fetch, url: string, body: unknown, timeoutMs: number, signal: AbortSignal | undefined): Promise<T> {
  if (signal?.aborted) throw abortError(signal);
  const ctl = new AbortController();
  const onAbort = () => ctl.abort(signal?.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  const timer = setTimeout(() => ctl.abort(), timerMs(timeoutMs));
  try {
    let resp: Response;
    let text: string;
    try {
      resp = await fetchFn(url, { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body), signal: ctl.signal, redirect: "error" });
      text = await readAnswer(resp);
    } catch (e) {
      if (signal?.aborted) throw abortError(signal);
      throw new NoAnswerError(`POST ${url}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    if (resp.status !== 200) throw answerError(resp, text);
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new NoAnswerError(`POST ${url}: the answer is not JSON: ${text.slice(0, 100)}`, { cause: e });
    }
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}
