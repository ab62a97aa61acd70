/**
 * An answer of the relay other than the one a call expects. `code` is the
 * protocol's error code, or "" when the body was not the relay's (a proxy's
 * page, say).
 */
export class RelayError extends Error {
    name = "RelayError";
    status;
    code;
    /** With cursor_ahead: the device's head. */
    head;
    /** With cursor_ahead: the store's current epoch. */
    epoch;
    /** With a 429: which limit refused. */
    limit;
    /** The answer's Retry-After in seconds, at most 60 (MAX_RETRY_AFTER_SECONDS), when it had one. */
    retryAfter;
    constructor(status, body, retryAfter, fallback = "") {
        const code = typeof body?.error === "string" ? body.error : "";
        const message = typeof body?.message === "string" ? body.message : fallback;
        let text = `relay answered ${status}`;
        if (code)
            text += ` ${code}`;
        if (typeof body?.limit === "string")
            text += ` (${body.limit})`;
        if (message)
            text += `: ${message}`;
        super(text);
        this.status = status;
        this.code = code;
        this.head = typeof body?.head === "number" ? body.head : undefined;
        this.epoch = typeof body?.epoch === "string" ? body.epoch : undefined;
        this.limit = typeof body?.limit === "string" ? body.limit : undefined;
        this.retryAfter = retryAfter;
    }
    /** Whether the same request may succeed later: 429 and every 5xx. */
    get temporary() {
        return this.status === 429 || this.status >= 500;
    }
    /**
     * The cursor sent is above the device's head, or was taken in another
     * store epoch than the current one (409 cursor_ahead).
     */
    get cursorAhead() {
        return this.status === 409 && this.code === "cursor_ahead";
    }
}
/**
 * No answer came: the network failed, the request timed out, or (in a
 * browser) the relay's answer was withheld, as CORS does for an origin the
 * relay does not allow. Whether the relay processed the request is unknown.
 */
export class NoAnswerError extends Error {
    name = "NoAnswerError";
    constructor(message, options) {
        super(message, options);
    }
}
/** Thrown by calls whose signal was aborted. */
export function abortError(signal) {
    const r = signal?.reason;
    if (r instanceof Error)
        return r;
    const e = new Error("aborted");
    e.name = "AbortError";
    return e;
}
/** Retrying may help: no answer, 429, 5xx. */
export function retryable(err) {
    if (err instanceof RelayError)
        return err.temporary;
    return err instanceof NoAnswerError;
}
/**
 * The relay (or a proxy in front of it) does not stream: GET /v1/stream is
 * not served, its answer is not an event stream, or its first event did
 * not come in time (a proxy that buffers answers). listen then polls.
 */
export class StreamUnavailableError extends Error {
    name = "StreamUnavailableError";
}
