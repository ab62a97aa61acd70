// A stand-in relay for the tests of store epochs: one device's queue over
// real HTTP on a loopback port, whose store history a test rolls back (a
// failover that lost commits, a restored backup). It speaks register, poll
// and ack in JSON as docs/PROTOCOL.md gives them, epochs included, and
// records every poll and ack so that a test can check what the client
// sent. It checks no token. (The Go clients' tests use internal/epochtest,
// the same in Go.)
import { createServer } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface StoredEnvelope {
  seq: number;
  id: string;
  from: string;
  payload: string; // base64
}

/** A poll or ack as the relay received it. */
export interface Request {
  op: "poll" | "ack" | "poll (held)";
  /** null when the request carried none. */
  cursor: number | null;
  /** null when the request carried none. */
  epoch: string | null;
  /** The relay's answer. */
  status: number;
}

export class EpochRelay {
  url = "";
  readonly requests: Request[] = [];
  private envs: StoredEnvelope[] = [];
  private head = 0;
  /** What the device acknowledged. */
  cursor = 0;
  private waiters = new Set<() => void>();
  private readonly server: Server;

  private constructor(public epoch: string) {
    this.server = createServer((req, res) => {
      this.serve(req, res).catch((e: unknown) => {
        res.writeHead(500).end(String(e));
      });
    });
  }

  static async start(epoch: string): Promise<EpochRelay> {
    const r = new EpochRelay(epoch);
    await new Promise<void>((resolve) => r.server.listen(0, "127.0.0.1", resolve));
    r.url = `http://127.0.0.1:${(r.server.address() as AddressInfo).port}`;
    return r;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Stores an envelope for the device; returns its seq. */
  add(from: string, id: string): number {
    this.addQuiet(from, id);
    this.wake();
    return this.head;
  }

  /**
   * The store's history goes back: what was stored above head is gone, the
   * acknowledged cursor is back at cursor (at most head), the store answers
   * in epoch, and then (from, id) are stored after it at once, so that no
   * poll sees the store between the two.
   */
  rollback(head: number, cursor: number, epoch: string, then: [string, string][] = []): void {
    this.envs = this.envs.filter((e) => e.seq <= head);
    this.head = head;
    this.cursor = Math.min(cursor, head);
    this.epoch = epoch;
    for (const [from, id] of then) this.addQuiet(from, id);
    this.wake();
  }

  private addQuiet(from: string, id: string): void {
    this.head++;
    this.envs.push({ seq: this.head, id, from, payload: Buffer.from(id).toString("base64") });
  }

  private wake(): void {
    for (const w of this.waiters) w();
    this.waiters.clear();
  }

  /** Applies the wire's rules for a cursor and epoch; acknowledges on success. */
  private check(res: ServerResponse, op: "poll" | "ack", cursor: number | null, epoch: string | null): boolean {
    const req: Request = { op, cursor, epoch, status: 0 };
    if (epoch !== null && !/^[A-Za-z0-9_-]{1,32}$/.test(epoch)) {
      req.status = 400;
      answer(res, 400, { error: "bad_request", message: "epoch: 1 to 32 characters of [A-Za-z0-9_-]" });
    } else if ((epoch !== null && epoch !== this.epoch) || (cursor !== null && cursor > this.head)) {
      req.status = 409;
      answer(res, 409, { error: "cursor_ahead", message: "the cursor is above the device's head or of another epoch", head: this.head, epoch: this.epoch });
    } else if (cursor !== null && cursor > this.cursor) {
      this.cursor = cursor;
    }
    this.requests.push(req);
    return req.status === 0;
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const u = new URL(req.url ?? "/", this.url);
    let text = "";
    for await (const chunk of req) text += String(chunk);
    if (req.method === "POST" && u.pathname === "/v1/register") {
      answer(res, 200, { household: "h", device: "phone", cursor: this.cursor, epoch: this.epoch });
    } else if (req.method === "POST" && u.pathname === "/v1/ack") {
      const body = JSON.parse(text) as { cursor: number; epoch?: string };
      if (this.check(res, "ack", body.cursor, body.epoch ?? null)) res.writeHead(204).end();
    } else if (req.method === "GET" && u.pathname === "/v1/poll") {
      const c = u.searchParams.get("cursor");
      if (!this.check(res, "poll", c === null ? null : Number(c), u.searchParams.get("epoch"))) return;
      await this.poll(res, Number(u.searchParams.get("wait") ?? "0"), req);
    } else {
      answer(res, 404, { error: "not_found", message: u.pathname });
    }
  }

  private async poll(res: ServerResponse, wait: number, req: IncomingMessage): Promise<void> {
    const epoch = this.epoch;
    const deadline = Date.now() + wait * 1000;
    for (;;) {
      if (this.epoch !== epoch) {
        // The epoch changed while the poll was held: 409, as a new request
        // of the old epoch gets.
        this.requests.push({ op: "poll (held)", cursor: null, epoch: null, status: 409 });
        answer(res, 409, { error: "cursor_ahead", message: "the store's epoch changed", head: this.head, epoch: this.epoch });
        return;
      }
      const out = this.envs.filter((e) => e.seq > this.cursor);
      const left = deadline - Date.now();
      if (out.length > 0 || left <= 0) {
        const last = out.length > 0 ? out[out.length - 1]!.seq : this.cursor;
        answer(res, 200, { cursor: last, more: false, envelopes: out.map((e) => ({ ...e, sent_at: "2026-11-29T18:02:03.123456Z" })), epoch });
        return;
      }
      const gone = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => done(false), left);
        const onClose = () => done(true);
        const done = (closed: boolean) => {
          clearTimeout(timer);
          this.waiters.delete(wake);
          req.socket.off("close", onClose);
          resolve(closed);
        };
        const wake = () => done(false);
        this.waiters.add(wake);
        req.socket.once("close", onClose);
      });
      if (gone) return;
    }
  }
}

function answer(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "Content-Type": "application/json" }).end(JSON.stringify(body));
}
