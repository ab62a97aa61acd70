import { decodeBase64 } from "./base64.js";
import { NoAnswerError, RelayError } from "./errors.js";
import { StreamUnavailableError } from "./errors.js";
/**
 * An open GET /v1/stream, read with fetch: next() gives its events in
 * order. After the end event it resolves no more (it rejects); a body that
 * ends without one, or carries nothing for the idle timeout, rejects with
 * NoAnswerError (the stream was cut: open the next from the cursor).
 */
export class RelayStream {
    ctl;
    idleMs;
    done;
    reader;
    decoder = new TextDecoder();
    buf = "";
    ready = false;
    ended = false;
    timer;
    timedOut = false;
    constructor(ctl, readyMs, idleMs, done) {
        this.ctl = ctl;
        this.idleMs = idleMs;
        this.done = done;
        this.arm(readyMs);
    }
    arm(ms) {
        clearTimeout(this.timer);
        this.timer = setTimeout(() => {
            this.timedOut = true;
            this.ctl.abort();
        }, ms);
    }
    /** @internal */
    attach(body) {
        this.reader = body.getReader();
    }
    /** Ends the stream. */
    close(reason) {
        clearTimeout(this.timer);
        this.ctl.abort(reason);
        this.reader?.cancel().catch(() => { });
        this.done();
    }
    /** The next event. */
    async next() {
        if (this.ended || !this.reader)
            throw new NoAnswerError("the stream has ended");
        let name = "";
        let data = "";
        for (;;) {
            const nl = this.buf.indexOf("\n");
            if (nl < 0) {
                let chunk;
                try {
                    chunk = await this.reader.read();
                }
                catch (e) {
                    throw this.cut(e);
                }
                if (chunk.done)
                    throw this.cut(undefined);
                this.arm(this.idleMs);
                this.buf += this.decoder.decode(chunk.value, { stream: true });
                continue;
            }
            let line = this.buf.slice(0, nl);
            this.buf = this.buf.slice(nl + 1);
            if (line.endsWith("\r"))
                line = line.slice(0, -1);
            if (line === "") {
                if (name === "")
                    continue;
                return this.event(name, data);
            }
            if (line.startsWith(":")) {
                if (this.ready)
                    return { kind: "ping" };
            }
            else if (line.startsWith("event: ")) {
                name = line.slice("event: ".length);
            }
            else if (line.startsWith("data: ")) {
                data = line.slice("data: ".length);
            }
            // id: lines (the batch's cursor, which its data carries too) and
            // fields this client does not know are skipped.
        }
    }
    cut(e) {
        if (this.timedOut && !this.ready)
            return new StreamUnavailableError("no stream event within the time allowed (a proxy that buffers answers?)");
        const why = this.timedOut ? "nothing received for too long" : e instanceof Error ? e.message : "the answer ended without its last event";
        return new NoAnswerError(`the stream was cut: ${why}`, { cause: e });
    }
    event(name, data) {
        let v;
        try {
            v = JSON.parse(data);
        }
        catch (e) {
            throw new NoAnswerError(`the stream's ${name} event is not JSON`, { cause: e });
        }
        switch (name) {
            case "ready":
            case "envelopes": {
                const res = v;
                this.ready = true;
                const result = {
                    cursor: res.cursor,
                    more: res.more,
                    envelopes: res.envelopes.map((e) => ({ seq: e.seq, id: e.id, from: e.from, sent_at: e.sent_at, payload: decodeBase64(e.payload) })),
                    ...(typeof res.epoch === "string" && { epoch: res.epoch }),
                };
                return { kind: name, result };
            }
            case "end": {
                this.ended = true;
                const b = v;
                const end = { reason: b.reason };
                if (b.status) {
                    const body = { error: b.error ?? "", message: b.message ?? "" };
                    if (b.head !== undefined)
                        body.head = b.head;
                    if (b.epoch !== undefined)
                        body.epoch = b.epoch;
                    if (b.limit !== undefined)
                        body.limit = b.limit;
                    end.error = new RelayError(b.status, body, undefined, b.message ?? "");
                }
                return { kind: "end", end };
            }
        }
        return { kind: "ping" }; // an event this client does not know
    }
}
