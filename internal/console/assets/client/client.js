import { Backoff, MAX_RETRY_AFTER_SECONDS, sleep, timerMs } from "./backoff.js";
import { decodeBase64, encodeBase64, encodeBase64URL } from "./base64.js";
import { FixedToken, UnauthorizedError } from "./credentials.js";
import { MemoryCursorStore } from "./cursor.js";
import { NoAnswerError, RelayError, StreamUnavailableError, abortError, retryable } from "./errors.js";
import { RelayStream } from "./stream.js";
/** How long listen's polls are held by default, in seconds. */
export const DEFAULT_WAIT = 20;
/**
 * How much longer than its wait a poll may take before it counts as
 * unanswered: the relay answers within the wait; proxies and a slow
 * network add to it.
 */
const POLL_MARGIN_MS = 15_000;
/**
 * The most of one answer that is read, as in the Go client: a poll returns
 * at most 2 MiB of payload (FN_POLL_BUDGET_BYTES) plus one envelope beyond
 * it, in base64; anything near this is not the relay's.
 */
export const MAX_ANSWER_BYTES = 64 << 20;
const STREAM_READY_MS = 10_000;
const STREAM_IDLE_MS = 60_000;
// How long listen polls after finding streams unavailable.
const STREAM_RETRY_MS = 5 * 60_000;
// A stream acknowledges nothing itself: listen acknowledges its position
// at an event or ping once ACK_EVERY_MS has passed since the last ack, at
// once when ACK_SEQS seqs are unacknowledged, and when the stream ends;
// the next stream's cursor acknowledges the rest (docs/PROTOCOL.md).
const ACK_EVERY_MS = 60_000;
const ACK_SEQS = 1000;
/** A fresh send id: 16 random bytes in base64url. */
export function newId() {
    return encodeBase64URL(crypto.getRandomValues(new Uint8Array(16)));
}
const utf8 = new TextEncoder();
/**
 * A client of one relay acting as one device (the token's). It runs in
 * browsers and in Node 20+ on the platform's fetch; it speaks JSON only.
 * A device runs one listen at a time: a newer poll ends the older one.
 */
export class RelayClient {
    url;
    source;
    state;
    fetchFn;
    requestTimeoutMs;
    maxBackoffMs;
    log;
    // What listen receives over now, for the state other calls report.
    transport;
    constructor(opts) {
        this.url = opts.url.replace(/\/+$/, "");
        const token = opts.token?.trim() ?? "";
        this.source = opts.credentials ?? new FixedToken(token);
        this.state = stateReporter(opts.onState);
        // Called through a closure: a browser's fetch refuses another `this`.
        this.fetchFn = opts.fetch ?? ((input, init) => globalThis.fetch(input, init));
        this.requestTimeoutMs = opts.requestTimeoutMs ?? 30_000;
        this.maxBackoffMs = opts.maxBackoffMs ?? 60_000;
        this.log = opts.log ?? (() => { });
        if (!/^https?:\/\/[^/]/.test(this.url))
            throw new Error(`relay client: URL ${JSON.stringify(opts.url)} is not http:// or https://`);
        if (!opts.credentials && !token)
            throw new Error("relay client: no token");
        if (!(this.requestTimeoutMs > 0) || !(this.maxBackoffMs > 0))
            throw new Error("relay client: timeouts and backoff must be positive");
    }
    /** Creates the token's device or updates it; resolves to its cursor as the relay knows it, and that cursor's epoch. */
    async register(body = {}, opts = {}) {
        return (await this.request("POST", "/v1/register", body, 200, this.requestTimeoutMs, opts.signal));
    }
    /**
     * The relay's VAPID public key (GET /v1/push/vapid, unpadded base64url),
     * a page's applicationServerKey for pushManager.subscribe. A RelayError
     * of status 404 when the relay sends no Web Push.
     */
    async vapidKey(opts = {}) {
        return (await this.request("GET", "/v1/push/vapid", undefined, 200, this.requestTimeoutMs, opts.signal)).public_key;
    }
    /** One page of the household's directory, ordered by device name (readDirectory reads them all). */
    async devices(opts = {}) {
        const q = new URLSearchParams();
        if (opts.limit !== undefined)
            q.set("limit", String(opts.limit));
        if (opts.after !== undefined)
            q.set("after", opts.after);
        const path = q.toString() ? `/v1/devices?${q}` : "/v1/devices";
        return (await this.request("GET", path, undefined, 200, this.requestTimeoutMs, opts.signal));
    }
    /**
     * Invites a device of the token's household (admin tokens only; POST
     * /v1/invitations): its single-use code, which the new device redeems
     * with pair, and the code's expiry. Inviting a device again replaces
     * its unredeemed code. A device of that name that exists is a RelayError
     * of status 409 (device_exists) unless replace is true: redeeming the
     * invitation then removes that device first.
     */
    async invite(device, opts = {}) {
        const body = { device };
        if (opts.scope !== undefined)
            body.scope = opts.scope;
        if (opts.replace)
            body.replace = true;
        return (await this.request("POST", "/v1/invitations", body, 201, this.requestTimeoutMs, opts.signal));
    }
    /** The household's pending invitations and those redeemed in the last day (admin tokens only; GET /v1/invitations). */
    async invitations(opts = {}) {
        return (await this.request("GET", "/v1/invitations", undefined, 200, this.requestTimeoutMs, opts.signal));
    }
    /**
     * Cancels a device's pending invitation (admin tokens only; DELETE
     * /v1/invitations/{device}): its code no longer pairs. A RelayError of
     * status 404 when none is pending.
     */
    async cancelInvitation(device, opts = {}) {
        await this.request("DELETE", `/v1/invitations/${encodeURIComponent(device)}`, undefined, 204, this.requestTimeoutMs, opts.signal);
    }
    /**
     * Removes a device of the token's household (admin tokens only; DELETE
     * /v1/devices/{device}): its tokens, renewal secret and pending
     * envelopes stop at once. A RelayError of status 404 when there is no
     * such device.
     */
    async removeDevice(device, opts = {}) {
        await this.request("DELETE", `/v1/devices/${encodeURIComponent(device)}`, undefined, 204, this.requestTimeoutMs, opts.signal);
    }
    /**
     * Exactly one send request. A RelayError says how the relay refused; a
     * NoAnswerError means whether it stored the send is unknown: send again
     * with the same id and payload to find out.
     */
    async sendOnce(to, payload, id, opts = {}) {
        const bytes = typeof payload === "string" ? utf8.encode(payload) : payload;
        const body = { id, to, payload: encodeBase64(bytes) };
        return (await this.request("POST", "/v1/send", body, 202, this.requestTimeoutMs, opts.signal));
    }
    /**
     * Sends payload to the devices in to, retrying until the relay stores it,
     * refuses it for good, or the signal aborts. Every attempt carries the
     * same id and body, so a retry after a lost answer gets the first answer
     * and nothing is stored twice. Retries no answer, 429, 500 and 503 with
     * backoff; 400, 401, 403, 404, 409 and 413 reject at once with a
     * RelayError.
     */
    async send(to, payload, opts = {}) {
        const id = opts.id ?? newId();
        const bytes = typeof payload === "string" ? utf8.encode(payload) : payload;
        const bo = new Backoff(this.maxBackoffMs);
        let last; // the last attempt that ended on its own
        const giveUp = (err) => {
            last ??= err;
            return new Error(`relay client: send ${id}: gave up (last attempt: ${String(last)})`, { cause: last });
        };
        for (;;) {
            let err;
            try {
                return await this.sendOnce(to, bytes, id, opts.signal ? { signal: opts.signal } : {});
            }
            catch (e) {
                err = e;
            }
            if (opts.signal?.aborted)
                throw giveUp(err);
            if (!retryable(err))
                throw err;
            last = err;
            const d = bo.next(err);
            this.log(`send ${id}: ${String(err)}; retrying in ${Math.round(d)} ms`);
            this.state({ kind: "retrying", delayMs: d, error: err });
            if (!(await sleep(d, opts.signal)))
                throw giveUp(err);
        }
    }
    /** One poll request; it may take wait seconds plus a margin before it counts as unanswered. */
    async poll(opts = {}) {
        const wait = opts.wait ?? 0;
        let path = `/v1/poll?wait=${wait}`;
        if (opts.cursor !== undefined)
            path += `&cursor=${opts.cursor}`;
        if (opts.epoch !== undefined)
            path += `&epoch=${encodeURIComponent(opts.epoch)}`;
        if (opts.limit !== undefined)
            path += `&limit=${opts.limit}`;
        const res = (await this.request("GET", path, undefined, 200, wait * 1000 + POLL_MARGIN_MS, opts.signal));
        return {
            cursor: res.cursor,
            more: res.more,
            envelopes: res.envelopes.map((e) => ({ seq: e.seq, id: e.id, from: e.from, sent_at: e.sent_at, payload: decodeBase64(e.payload) })),
            ...(typeof res.epoch === "string" && { epoch: res.epoch }),
        };
    }
    /**
     * Acknowledges everything at or below cursor, in one request; epoch, the
     * one the cursor was taken in, is checked when given. A cursor above the
     * device's head, or an epoch that is not the store's current one, is a
     * RelayError with cursorAhead, and nothing is acknowledged.
     */
    async ack(cursor, opts = {}) {
        const body = opts.epoch === undefined ? { cursor } : { cursor, epoch: opts.epoch };
        await this.request("POST", "/v1/ack", body, 204, this.requestTimeoutMs, opts.signal);
    }
    /**
     * Opens a stream (GET /v1/stream): what polls would answer, as events, on
     * one request. It rejects as a poll does (a RelayError, after one renewal
     * of refused credentials), or with StreamUnavailableError where the
     * relay or a proxy in front of it does not stream (a 404, an answer that
     * is not an event stream, no first event within 10 s).
     */
    async stream(opts = {}) {
        let path = "/v1/stream";
        const q = [];
        if (opts.cursor !== undefined)
            q.push(`cursor=${opts.cursor}`);
        if (opts.epoch !== undefined)
            q.push(`epoch=${encodeURIComponent(opts.epoch)}`);
        if (q.length > 0)
            path += "?" + q.join("&");
        const readyMs = opts.readyTimeoutMs ?? STREAM_READY_MS;
        const open = async (tok) => {
            const ctl = new AbortController();
            // Closing cancels the body's reader too: aborting the fetch alone
            // does not always end a body already being read (seen with Node
            // 20's fetch: pings kept coming after the abort).
            const onAbort = () => s.close(opts.signal?.reason);
            const s = new RelayStream(ctl, readyMs, opts.idleTimeoutMs ?? STREAM_IDLE_MS, () => opts.signal?.removeEventListener("abort", onAbort));
            opts.signal?.addEventListener("abort", onAbort, { once: true });
            let resp;
            try {
                if (opts.signal?.aborted)
                    throw abortError(opts.signal);
                resp = await this.fetchFn(this.url + path, {
                    method: "GET",
                    headers: { Authorization: `Bearer ${tok}`, Accept: "text/event-stream" },
                    signal: ctl.signal,
                    redirect: "error",
                });
            }
            catch (e) {
                s.close();
                if (opts.signal?.aborted)
                    throw abortError(opts.signal);
                if (s.timedOut)
                    throw new StreamUnavailableError(`GET ${path}: no answer within ${readyMs} ms`);
                throw new NoAnswerError(`GET ${path}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
            }
            const type = (resp.headers.get("Content-Type") ?? "").split(";")[0].trim();
            if (resp.status !== 200 || type !== "text/event-stream") {
                let text = "";
                try {
                    text = await readAnswer(resp);
                }
                catch {
                    // the status says enough
                }
                s.close();
                if (resp.status === 404 || resp.status === 405 || resp.status === 200)
                    throw new StreamUnavailableError(`GET ${path}: ${resp.status} ${type}`);
                throw answerError(resp, text);
            }
            s.attach(resp.body);
            return s;
        };
        const unauthorized = (e) => this.state({ kind: "unauthorized", error: e });
        let tok;
        try {
            tok = await this.source.token(opts.signal);
        }
        catch (e) {
            if (e instanceof UnauthorizedError)
                unauthorized(e);
            throw e;
        }
        try {
            return await open(tok);
        }
        catch (e) {
            if (!(e instanceof RelayError && e.status === 401))
                throw e;
            let fresh;
            try {
                fresh = await this.source.refused(tok, opts.signal);
            }
            catch (re) {
                if (re instanceof UnauthorizedError) {
                    unauthorized(re);
                    throw refusal(e, re);
                }
                throw re;
            }
            try {
                return await open(fresh);
            }
            catch (e2) {
                if (e2 instanceof RelayError && e2.status === 401)
                    unauthorized(e2);
                throw e2;
            }
        }
    }
    /**
     * The device's receive loop. It holds a stream (GET /v1/stream) or, where
     * streams are not available (an older relay, a proxy that buffers
     * answers: detected, and tried again every 5 minutes; or streams: false),
     * polls. It hands each envelope to handler once, in seq order, and saves
     * the position (cursor and store epoch) after each handler resolved,
     * before the next envelope. Every poll and stream carries the saved
     * cursor, which acknowledges it, and its epoch once a relay named one;
     * while a stream is open the position is acknowledged at an event or
     * ping once a minute has passed since the last ack, at once when 1,000
     * seqs are unacknowledged, and when the stream ends. An answer with more waiting is
     * followed at once by the next poll; a stream that ends (its life, a
     * drain) or is cut is opened again from the saved position.
     *
     * It survives no answer, a cut stream, 429, 500 and 503 (trying again
     * with the same cursor after a backoff that honours Retry-After), and
     * 409 cursor_ahead: a saved cursor above the device's head or of another
     * store epoch, as after a failover to a database that lacked the last
     * commits, the relay's data was restored from an older backup, or the
     * device was removed and registered again. Then it polls once without a
     * cursor or epoch, which acknowledges nothing and starts above the
     * cursor the relay knows, goes on from the cursor and epoch that answer
     * names, and reports the state "resynced": nothing the relay holds is
     * skipped. Seqs may then name other envelopes than before; an app that
     * must not process anything twice tells repeats by from and id.
     *
     * Resolves when the signal aborts (also while handler runs); rejects
     * with the handler's or the cursor store's error, or with a RelayError
     * that retrying cannot fix (400, 401, 403, 404). Either way the state
     * goes "stopped".
     */
    async listen(handler, opts = {}) {
        try {
            await this.receive(handler, opts);
        }
        catch (err) {
            this.state({ kind: "stopped", error: err });
            throw err;
        }
        this.state({ kind: "stopped" });
    }
    async receive(handler, opts) {
        const wait = opts.wait ?? DEFAULT_WAIT;
        if (!Number.isInteger(wait) || wait < 1)
            throw new Error("relay client: listen needs a wait of at least 1 s");
        const store = opts.cursorStore ?? new MemoryCursorStore();
        const signal = opts.signal ?? new AbortController().signal;
        const pos = { ...(await store.load()) };
        let saved = { ...pos };
        const save = async () => {
            if (pos.cursor === saved.cursor && pos.epoch === saved.epoch)
                return;
            await store.save({ ...pos });
            saved = { ...pos };
        };
        const bo = new Backoff(this.maxBackoffMs);
        let ahead; // the cursor_ahead being recovered from: the next poll leaves cursor and epoch out
        let streamAgain = opts.streams === false ? Infinity : 0; // when a stream is tried (again)
        // Hands res's envelopes over in order; false once stopped.
        const hand = async (res, recovering) => {
            // The answer's seqs are of its epoch, so the cursors saved below are
            // too; a recovering answer names the whole position.
            if (recovering || res.epoch !== undefined)
                pos.epoch = res.epoch;
            for (const e of res.envelopes) {
                if (signal.aborted)
                    return false;
                // With the cursor sent the relay never answers at or below it; a
                // recovering answer starts wherever the relay stands.
                if (e.seq <= pos.cursor && !recovering)
                    continue;
                try {
                    await handler(e, signal);
                }
                catch (err) {
                    if (signal.aborted)
                        return false;
                    throw new Error(`relay client: handler at seq ${e.seq}: ${String(err)}`, { cause: err });
                }
                pos.cursor = e.seq;
                await save();
            }
            if (recovering && res.envelopes.length === 0)
                pos.cursor = res.cursor;
            // A recovery without envelopes, or an epoch learned.
            await save();
            return true;
        };
        // Handles a failure: false once stopped; throws what ends listen.
        const failed = async (err, recovering) => {
            if (signal.aborted)
                return false;
            if (err instanceof RelayError && err.cursorAhead && !recovering) {
                if (err.epoch !== undefined && pos.epoch !== undefined && err.epoch !== pos.epoch) {
                    this.log(`listen: the store's epoch is ${err.epoch}, not ${String(pos.epoch)} of cursor ${pos.cursor}; polling without them`);
                }
                else {
                    this.log(`listen: cursor ${pos.cursor} is above the device's head ${err.head}; polling without it`);
                }
                ahead = err;
                return true;
            }
            if (!retryable(err))
                throw err;
            const d = bo.next(err);
            this.log(`listen: ${String(err)}; trying again in ${Math.round(d)} ms`);
            this.state({ kind: "retrying", delayMs: d, error: err });
            return sleep(d, signal);
        };
        // A stream that could not be opened or read: where streams are not
        // available here, polls for a while; else a failure as a poll's.
        const streamFailed = async (err) => {
            if (err instanceof StreamUnavailableError) {
                this.log(`listen: ${err.message}; polling instead for ${STREAM_RETRY_MS / 60_000} minutes`);
                streamAgain = Date.now() + STREAM_RETRY_MS;
                return true;
            }
            return failed(err, false);
        };
        // One stream, until it ends; false once stopped.
        const streamOnce = async () => {
            this.transport = "stream";
            this.state({ kind: "connecting", transport: "stream" });
            let s;
            try {
                s = await this.stream({ cursor: pos.cursor, epoch: pos.epoch, signal, ...(opts.streamReadyTimeoutMs !== undefined && { readyTimeoutMs: opts.streamReadyTimeoutMs }) });
            }
            catch (err) {
                return streamFailed(err);
            }
            let acked = { ...pos };
            let ackedAt = Date.now();
            const ack = async () => {
                if ((acked.cursor === pos.cursor && acked.epoch === pos.epoch) || signal.aborted)
                    return;
                const at = { ...pos };
                try {
                    await this.ack(at.cursor, { epoch: at.epoch, signal });
                    acked = at;
                    ackedAt = Date.now();
                }
                catch (err) {
                    // The error last: its own words end with the step that helps.
                    this.log(`listen: could not acknowledge ${at.cursor} (the next stream's cursor will): ${String(err)}`);
                }
            };
            try {
                for (;;) {
                    let ev;
                    try {
                        ev = await s.next();
                    }
                    catch (err) {
                        return streamFailed(err);
                    }
                    switch (ev.kind) {
                        case "ready":
                            bo.reset();
                            this.state({ kind: "connected", transport: "stream" });
                            if (!(await hand(ev.result, false)))
                                return false;
                            break;
                        case "envelopes":
                            if (!(await hand(ev.result, false)))
                                return false;
                            if (Date.now() - ackedAt >= ACK_EVERY_MS || pos.cursor - acked.cursor >= ACK_SEQS)
                                await ack();
                            break;
                        case "ping":
                            if (Date.now() - ackedAt >= ACK_EVERY_MS)
                                await ack();
                            break;
                        case "end":
                            await ack();
                            if (ev.end.reason === "superseded")
                                return sleep(1000 + Math.random() * 500, signal); // another tab, most likely: see the poll's pause
                            if (ev.end.reason === "drained" || ev.end.reason === "expired")
                                return true;
                            return failed(ev.end.error ?? new NoAnswerError(`the stream ended: ${ev.end.reason}`), false);
                    }
                    if (signal.aborted)
                        return false;
                    if (this.source.due?.()) {
                        // The next stream renews as it opens.
                        this.log("listen: the token is due for renewal; opening the stream again");
                        return true;
                    }
                }
            }
            finally {
                s.close();
            }
        };
        while (!signal.aborted) {
            if (ahead === undefined && Date.now() >= streamAgain) {
                if (!(await streamOnce()))
                    return;
                continue;
            }
            const recovering = ahead !== undefined;
            let res;
            const started = Date.now();
            this.transport = "poll";
            if (!recovering)
                this.state({ kind: "waiting", transport: "poll" });
            try {
                res = await this.poll(recovering
                    ? { wait: 0, signal, ...(opts.limit !== undefined && { limit: opts.limit }) } // not held: put the position right at once
                    : { cursor: pos.cursor, epoch: pos.epoch, wait, signal, ...(opts.limit !== undefined && { limit: opts.limit }) });
            }
            catch (err) {
                if (!(await failed(err, recovering)))
                    return;
                continue;
            }
            bo.reset();
            if (!recovering && res.envelopes.length === 0 && !res.more && Date.now() - started < Math.min(1000, (wait * 1000) / 2)) {
                // A held poll that ends empty at once was most likely superseded by
                // another poller of this device (a second tab): polling straight
                // back would supersede that one in turn, and the two would spin.
                if (!(await sleep(1000 + Math.random() * 500, signal)))
                    return;
            }
            if (!(await hand(res, recovering)))
                return;
            if (ahead !== undefined) {
                this.log(`listen: resynchronised at cursor ${pos.cursor}, epoch ${String(pos.epoch)}`);
                this.state({ kind: "resynced", cursor: pos.cursor, epoch: pos.epoch, error: ahead });
                ahead = undefined;
            }
            // more, or a hold that ended: poll again at once, with the new cursor.
        }
    }
    /**
     * One request with the source's token; when the relay refuses it with
     * 401, the source is asked once for a fresh one and the request is made
     * again. Reports connected and unauthorized.
     */
    async request(method, path, body, want, timeoutMs, signal) {
        const unauthorized = (e) => this.state({ kind: "unauthorized", error: e });
        let tok;
        try {
            tok = await this.source.token(signal);
        }
        catch (e) {
            if (e instanceof UnauthorizedError)
                unauthorized(e);
            throw e;
        }
        let res;
        try {
            res = await this.requestWith(tok, method, path, body, want, timeoutMs, signal);
        }
        catch (e) {
            if (!(e instanceof RelayError && e.status === 401))
                throw e;
            let fresh;
            try {
                fresh = await this.source.refused(tok, signal);
            }
            catch (re) {
                if (re instanceof UnauthorizedError) {
                    unauthorized(re);
                    throw refusal(e, re); // a 401, which retrying cannot fix
                }
                throw re; // renewing failed for a passing reason: retry later
            }
            try {
                res = await this.requestWith(fresh, method, path, body, want, timeoutMs, signal);
            }
            catch (e2) {
                if (e2 instanceof RelayError && e2.status === 401)
                    unauthorized(e2);
                throw e2;
            }
        }
        this.state(this.transport === undefined ? { kind: "connected" } : { kind: "connected", transport: this.transport });
        return res;
    }
    async requestWith(tok, method, path, body, want, timeoutMs, signal) {
        if (signal?.aborted)
            throw abortError(signal);
        const ctl = new AbortController();
        const onAbort = () => ctl.abort(signal?.reason);
        signal?.addEventListener("abort", onAbort, { once: true });
        let timedOut = false;
        const timer = setTimeout(() => {
            timedOut = true;
            ctl.abort();
        }, timerMs(timeoutMs));
        const noAnswer = (e) => {
            if (signal?.aborted)
                return abortError(signal);
            const why = timedOut ? `no answer within ${timeoutMs} ms` : e instanceof Error ? e.message : String(e);
            return new NoAnswerError(`${method} ${path}: ${why}`, { cause: e });
        };
        try {
            const headers = { Authorization: `Bearer ${tok}`, Accept: "application/json" };
            // No redirect is followed: the relay never answers one, and one to
            // another origin would carry the body there (fetch drops only the
            // token), as the Go client refuses it.
            const init = { method, headers, signal: ctl.signal, redirect: "error" };
            if (body !== undefined) {
                headers["Content-Type"] = "application/json";
                init.body = JSON.stringify(body);
            }
            let resp;
            let text;
            try {
                resp = await this.fetchFn(this.url + path, init);
                text = await readAnswer(resp);
            }
            catch (e) {
                throw noAnswer(e);
            }
            if (resp.status !== want)
                throw answerError(resp, text);
            if (want === 204)
                return undefined;
            try {
                return JSON.parse(text);
            }
            catch (e) {
                throw new NoAnswerError(`${method} ${path}: the answer is not JSON: ${text.slice(0, 100)}`, { cause: e });
            }
        }
        finally {
            clearTimeout(timer);
            signal?.removeEventListener("abort", onAbort);
        }
    }
}
/**
 * The answer's body as text, read as it streams in and given up on past
 * MAX_ANSWER_BYTES, so that a hostile or broken server cannot fill the
 * client's memory.
 */
export async function readAnswer(resp) {
    if (!resp.body)
        return "";
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    const parts = [];
    let n = 0;
    for (;;) {
        const { done, value } = await reader.read();
        if (done)
            break;
        n += value.byteLength;
        if (n > MAX_ANSWER_BYTES) {
            // Cancelling closes the connection: nothing more is received.
            await reader.cancel().catch(() => { });
            throw new Error(`the answer is larger than ${MAX_ANSWER_BYTES >> 20} MiB`);
        }
        parts.push(decoder.decode(value, { stream: true }));
    }
    parts.push(decoder.decode());
    return parts.join("");
}
export function answerError(resp, text) {
    // Whole seconds only (the relay never sends an HTTP date), capped: a
    // misconfigured proxy's huge value must neither stall nor, past
    // setTimeout's range, spin the client.
    const ra = (resp.headers.get("Retry-After") ?? "").trim();
    const retryAfter = /^\d+$/.test(ra) ? Math.min(Number(ra), MAX_RETRY_AFTER_SECONDS) : undefined;
    let body;
    try {
        const v = JSON.parse(text);
        if (v && typeof v === "object" && typeof v.error === "string")
            body = v;
    }
    catch {
        // Not the relay's body: a proxy's page or the HTTP server's own plain text.
    }
    return new RelayError(resp.status, body, retryAfter, text.trim().slice(0, 200));
}
/** Calls f on each change of kind or transport (each retry and resync too); never lets f's throw reach the client. */
function stateReporter(f) {
    if (!f)
        return () => { };
    let last;
    return (s) => {
        const key = s.kind + ("transport" in s ? `/${s.transport}` : "");
        if (key === last && s.kind !== "retrying" && s.kind !== "resynced")
            return;
        last = key;
        try {
            f(s);
        }
        catch {
            // The app's callback is not the client's business.
        }
    };
}
/**
 * What a call refused for good rejects with: the source's refusal when it
 * says more than the relay's 401 (a renewal refused, and what to do next;
 * it is a 401 too), else the relay's answer.
 */
function refusal(relay, source) {
    return source.cause !== undefined ? source : relay;
}
