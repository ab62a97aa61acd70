// Where the client's bearer token comes from: a fixed token, or a paired
// device's credentials, renewed before they expire and saved in a store
// the app provides before they are used (docs/PROTOCOL.md, pairing).
import { decodeBase64, encodeBase64 } from "./base64.js";
import { answerError, readAnswer } from "./client.js";
import { timerMs } from "./backoff.js";
import { NoAnswerError, RelayError, abortError } from "./errors.js";
/**
 * The device's renewal (or pairing) was refused: it must be paired again,
 * which its message says. It is a RelayError of status 401, as the
 * relay's refusal of a token is, so that `e instanceof RelayError &&
 * e.status === 401` is the one test an app needs; `cause` is the relay's
 * answer to the renewal.
 */
export class UnauthorizedError extends RelayError {
    constructor(message, cause) {
        super(401, { error: "unauthorized", message }, undefined);
        if (cause !== undefined)
            Object.defineProperty(this, "cause", { value: cause });
    }
}
/** A fixed token: a 401 is final. */
export class FixedToken {
    value;
    constructor(value) {
        this.value = value;
    }
    async token() {
        return this.value;
    }
    async refused() {
        throw new UnauthorizedError("the token is refused");
    }
}
/** One holder at a time, within this JavaScript realm. */
class Mutex {
    tail = Promise.resolve();
    run(fn) {
        const next = this.tail.then(fn, fn);
        this.tail = next.catch(() => { });
        return next;
    }
}
/** Credentials in memory: for tests, and apps that keep them elsewhere. Holders of one store renew one at a time. */
export class MemoryCredentialStore {
    c;
    mutex = new Mutex();
    constructor(initial) {
        this.c = initial;
    }
    async load() {
        return this.c && { ...this.c };
    }
    async save(c) {
        this.c = { ...c };
    }
    exclusive(fn) {
        return this.mutex.run(fn);
    }
}
/**
 * Credentials in the browser's localStorage (or any Storage), as JSON
 * under one key. localStorage is readable by every script of the page's
 * origin: serve the app from an origin of its own.
 */
export class LocalStorageCredentialStore {
    key;
    storage;
    locks;
    mutex = new Mutex();
    /**
     * locks defaults to the browser's navigator.locks, which every tab of the
     * origin shares: tabs renew one at a time. Without it, holders in this
     * realm still do.
     */
    constructor(key = "relay-credentials", storage, locks) {
        this.key = key;
        const s = storage ?? globalThis.localStorage;
        if (!s)
            throw new Error("relay client: no localStorage here; pass a storage");
        this.storage = s;
        this.locks = locks ?? globalThis.navigator?.locks;
    }
    exclusive(fn) {
        return this.locks ? this.locks.request(`relay-credentials:${this.key}`, fn) : this.mutex.run(fn);
    }
    async load() {
        const v = this.storage.getItem(this.key);
        return v === null ? undefined : JSON.parse(v);
    }
    async save(c) {
        // setItem throws when the storage is full: the set is then not used.
        this.storage.setItem(this.key, JSON.stringify(c));
    }
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
export class RenewingCredentials {
    url;
    store;
    cur;
    flight;
    finalError;
    lastError;
    retryAt = 0;
    lead;
    // When this process received cur, by its own clock, and the token's
    // life: a clock ahead of the relay's would otherwise find each new token
    // due at once. 0 for credentials loaded from the store.
    obtained = 0;
    life = 0;
    fetchFn;
    timeoutMs;
    now;
    constructor(url, store, cur, opts) {
        this.url = url;
        this.store = store;
        this.cur = cur;
        this.fetchFn = opts.fetch ?? ((input, init) => globalThis.fetch(input, init));
        this.timeoutMs = opts.requestTimeoutMs ?? 30_000;
        this.now = opts.now ?? Date.now;
        this.lead = renewLead(cur);
    }
    /** A source of the credentials saved in store (as pair saves them), renewed at the relay at url. */
    static async open(url, store, opts = {}) {
        const c = await store.load();
        if (!c)
            throw new Error("relay client: no credentials saved; pair first");
        checkCredentials(c);
        return new RenewingCredentials(url.replace(/\/+$/, ""), store, c, opts);
    }
    /** The current set. */
    get credentials() {
        return { ...this.cur };
    }
    token(signal) {
        return this.fresh(undefined, signal);
    }
    refused(tok, signal) {
        return this.fresh(tok, signal);
    }
    /** Whether the next token() renews: due, and no renewal failed a moment ago. */
    due() {
        const now = this.now();
        return this.finalError === undefined && now >= this.renewAt() && now >= this.retryAt;
    }
    renewAt() {
        const end = this.obtained && this.life > 0 ? this.obtained + this.life : Date.parse(this.cur.access_expires_at);
        return end - this.lead;
    }
    async fresh(refusedTok, signal) {
        let renewed = false; // by this call, or by one it waited for: at most one per call
        for (;;) {
            if (this.finalError)
                throw this.finalError;
            if (this.flight) {
                // Another call is renewing: wait for it and look again.
                const ok = await this.flight.then(() => true, () => false);
                renewed = ok;
                continue;
            }
            const now = this.now();
            const refused = refusedTok !== undefined && this.cur.access_token === refusedTok;
            const due = !renewed && (refused || now >= this.renewAt());
            if (!due)
                return this.cur.access_token;
            if (now < this.retryAt) {
                // A renewal failed a moment ago for a passing reason: the token
                // that still works is used meanwhile.
                if (refused || now >= Date.parse(this.cur.access_expires_at))
                    throw this.lastError;
                return this.cur.access_token;
            }
            const flight = this.renew(this.cur.renewal_secret, signal);
            this.flight = flight;
            try {
                await flight;
                renewed = true;
            }
            catch (e) {
                if (e instanceof RelayError && !e.temporary) {
                    this.finalError = renewalRefused(e);
                }
                else if (signal?.aborted) {
                    throw e; // this caller gave up; a waiter with time left renews
                }
                else {
                    this.lastError = e;
                    this.retryAt = now + RENEW_PAUSE_MS;
                }
            }
            finally {
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
    renew(secret, signal) {
        const run = async () => {
            if (await this.adoptSaved(secret))
                return;
            try {
                await this.exchange(secret, signal);
            }
            catch (e) {
                // A holder that renewed outside the store's lock may have spent
                // secret: its set, if saved, is taken up.
                if (e instanceof RelayError && !e.temporary && (await this.adoptSaved(secret)))
                    return;
                throw e;
            }
        };
        return this.store.exclusive ? this.store.exclusive(run) : run();
    }
    /** Makes current the saved set if it is another than secret's (another holder renewed), and says so. */
    async adoptSaved(secret) {
        let c;
        try {
            c = await this.store.load();
            if (!c || c.renewal_secret === secret)
                return false;
            checkCredentials(c);
        }
        catch {
            return false;
        }
        this.cur = c;
        this.lead = renewLead(c);
        this.obtained = 0;
        this.life = 0;
        return true;
    }
    async exchange(secret, signal) {
        const c = await postJSON(this.fetchFn, this.url + "/v1/renew", { renewal_secret: secret }, this.timeoutMs, signal);
        checkCredentials(c);
        if (this.cur.url !== undefined)
            c.url = this.cur.url;
        await this.store.save(c);
        this.cur = c;
        this.lead = renewLead(c);
        this.obtained = this.now();
        this.life = tokenLife(c);
    }
}
/**
 * The final error of a renewal the relay refused. The relay gives one 401
 * for every cause, so the error names them and the one step that helps
 * with each: a new invitation.
 */
function renewalRefused(e) {
    if (e.status !== 401)
        return new UnauthorizedError(`renewal refused (${e.message})`, e);
    return new UnauthorizedError(`renewal refused (${e.message}): this device's pairing was removed, or its renewal secret expired or was used by another copy of it; ask an admin for a new invitation and pair again`, e);
}
/**
 * Redeems an invitation's code at the relay at url (POST /v1/pair, no
 * token needed), saves the credentials in opts.store and resolves to
 * them. A wrong, used or expired code rejects with an UnauthorizedError (a
 * RelayError of status 401) that says to ask for a new invitation.
 * RenewingCredentials.open(url, store) then keeps them fresh.
 */
export async function pair(url, code, opts = {}) {
    const base = url.replace(/\/+$/, "");
    if (!/^https?:\/\/[^/]/.test(base))
        throw new Error(`relay client: URL ${JSON.stringify(url)} is not http:// or https://`);
    if (!code.trim())
        throw new Error("relay client: no pairing code");
    const body = { code };
    if (opts.scope !== undefined)
        body.scope = opts.scope;
    if (opts.identityKey !== undefined) {
        const k = typeof opts.identityKey === "string" ? opts.identityKey : encodeBase64(opts.identityKey);
        body.identity_key = k;
    }
    const fetchFn = opts.fetch ?? ((input, init) => globalThis.fetch(input, init));
    let c;
    try {
        c = await postJSON(fetchFn, base + "/v1/pair", body, opts.requestTimeoutMs ?? 30_000, opts.signal);
    }
    catch (e) {
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
function checkCredentials(c) {
    if (!c || typeof c.access_token !== "string" || !c.access_token || typeof c.renewal_secret !== "string" || !c.renewal_secret || Number.isNaN(Date.parse(c.access_expires_at))) {
        throw new Error("relay client: credentials without an access token, a renewal secret or an expiry");
    }
}
/**
 * A third of the access token's life, or 5 minutes, whichever is less;
 * the life is read from the token's iat and exp (both the relay's clock).
 */
function renewLead(c) {
    const life = tokenLife(c);
    return life > 0 ? Math.min(life / 3, MOST_LEAD_MS) : MOST_LEAD_MS;
}
/** The JWT's exp less its iat in ms, read without checking it; 0 when unknown. */
function tokenLife(c) {
    const parts = c.access_token.split(".");
    if (parts.length !== 3)
        return 0;
    try {
        const claims = JSON.parse(new TextDecoder().decode(decodeBase64URL(parts[1])));
        if (typeof claims.iat !== "number" || typeof claims.exp !== "number" || claims.exp <= claims.iat)
            return 0;
        return (claims.exp - claims.iat) * 1000;
    }
    catch {
        return 0;
    }
}
function decodeBase64URL(s) {
    const std = s.replace(/-/g, "+").replace(/_/g, "/");
    return decodeBase64(std + "=".repeat((4 - (std.length % 4)) % 4));
}
/** POSTs in as JSON; resolves to a 200's JSON, rejects with RelayError or NoAnswerError. */
async function postJSON(fetchFn, url, body, timeoutMs, signal) {
    if (signal?.aborted)
        throw abortError(signal);
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    const timer = setTimeout(() => ctl.abort(), timerMs(timeoutMs));
    try {
        let resp;
        let text;
        try {
            resp = await fetchFn(url, { method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body), signal: ctl.signal, redirect: "error" });
            text = await readAnswer(resp);
        }
        catch (e) {
            if (signal?.aborted)
                throw abortError(signal);
            throw new NoAnswerError(`POST ${url}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
        }
        if (resp.status !== 200)
            throw answerError(resp, text);
        try {
            return JSON.parse(text);
        }
        catch (e) {
            throw new NoAnswerError(`POST ${url}: the answer is not JSON: ${text.slice(0, 100)}`, { cause: e });
        }
    }
    finally {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
    }
}
