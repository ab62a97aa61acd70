// Node-only parts of the client: a cursor, pins and an identity kept in files.
import { randomBytes } from "node:crypto";
import { open, readFile, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

import { decodeBase64, encodeBase64 } from "./base64.js";
import type { Envelope } from "./client.js";
import type { CursorStore, Position } from "./cursor.js";
import { validEpoch } from "./cursor.js";
import type { PinStore } from "./keyring.js";
import { Identity } from "./seal.js";
import type { HeldStore } from "./sealed.js";

/**
 * Writes data to path so that a crash leaves the old contents or the new,
 * never a torn file: a temporary file beside it (mode 0600), synced,
 * renamed over the old one, and the directory synced.
 */
async function writeAtomic(path: string, data: string): Promise<void> {
  const dir = dirname(path);
  const tmp = join(dir, `.${basename(path)}.${randomBytes(6).toString("hex")}.tmp`);
  const f = await open(tmp, "wx", 0o600);
  try {
    await f.writeFile(data);
    await f.sync();
  } catch (e) {
    await f.close();
    await unlink(tmp).catch(() => {});
    throw e;
  }
  await f.close();
  try {
    await rename(tmp, path);
  } catch (e) {
    await unlink(tmp).catch(() => {});
    throw e;
  }
  // The rename is durable once the directory is.
  const d = await open(dir, "r");
  try {
    await d.sync();
  } finally {
    await d.close();
  }
}

/** The file's text, or undefined when it does not exist. */
async function readIfThere(path: string, what: string): Promise<string | undefined> {
  try {
    return await readFile(path, "utf8");
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`${what} ${path}: ${(e as Error).message}`, { cause: e });
  }
}

/**
 * A position kept in a file: the cursor's decimal digits, then a space and
 * the epoch when there is one, and a newline (as the Go client's
 * FileCursor), written atomically (a crash leaves the old position or the
 * new one). A file of digits alone, as written before epochs, loads with no
 * epoch.
 */
export class FileCursorStore implements CursorStore {
  constructor(readonly path: string) {}

  /** The file's position; a missing file is cursor 0 with no epoch. */
  async load(): Promise<Position> {
    const text = await readIfThere(this.path, "cursor file");
    if (text === undefined) return { cursor: 0 };
    const m = /^(\d{1,19})(?: ([A-Za-z0-9_-]{1,32}))?$/.exec(text.trim());
    if (!m || !Number.isSafeInteger(Number(m[1]))) {
      throw new Error(`cursor file ${this.path} does not hold a cursor: ${JSON.stringify(text.slice(0, 40))}`);
    }
    return m[2] === undefined ? { cursor: Number(m[1]) } : { cursor: Number(m[1]), epoch: m[2] };
  }

  async save(position: Position): Promise<void> {
    const { cursor, epoch } = position;
    if (!Number.isSafeInteger(cursor) || cursor < 0) throw new Error(`cursor ${cursor} is not a whole number`);
    if (epoch !== undefined && !validEpoch(epoch)) throw new Error(`epoch ${JSON.stringify(epoch)} is not 1 to 32 characters of [A-Za-z0-9_-]`);
    await writeAtomic(this.path, epoch === undefined ? `${cursor}\n` : `${cursor} ${epoch}\n`);
  }
}

/** A keyring's pins kept in a file (JSON, mode 0600), written atomically. */
export class FilePinStore implements PinStore {
  constructor(readonly path: string) {}

  load(): Promise<string | undefined> {
    return readIfThere(this.path, "pin file");
  }

  save(data: string): Promise<void> {
    return writeAtomic(this.path, data + "\n");
  }
}

/**
 * Held-back envelopes (SealedClient's held) kept in a file: a JSON array,
 * payloads in base64 and still sealed, as the Go client's FileHeld, written
 * atomically (mode 0600). A missing file holds nothing.
 */
export class FileHeldStore implements HeldStore {
  constructor(readonly path: string) {}

  async load(): Promise<Envelope[]> {
    const text = await readIfThere(this.path, "held file");
    if (text === undefined) return [];
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch (e) {
      throw new Error(`held file ${this.path}: ${(e as Error).message}`, { cause: e });
    }
    if (!Array.isArray(raw)) throw new Error(`held file ${this.path} does not hold an array`);
    return raw.map((e: { seq: number; id: string; from: string; sent_at: string; payload: string }) => ({ seq: e.seq, id: e.id, from: e.from, sent_at: e.sent_at, payload: decodeBase64(e.payload) }));
  }

  save(envelopes: Envelope[]): Promise<void> {
    const raw = envelopes.map((e) => ({ seq: e.seq, id: e.id, from: e.from, sent_at: e.sent_at, payload: encodeBase64(e.payload) }));
    return writeAtomic(this.path, JSON.stringify(raw) + "\n");
  }
}

/**
 * The identity whose seed the file holds (64 hex digits and a newline, as
 * the relay binary's -identity files); a missing file gets a new
 * identity's seed (mode 0600), kept for the next time: created says so.
 */
export async function loadIdentity(path: string): Promise<{ identity: Identity; created: boolean }> {
  const text = await readIfThere(path, "identity file");
  if (text === undefined) {
    const identity = await Identity.generate();
    await writeAtomic(path, Buffer.from(identity.seed).toString("hex") + "\n");
    return { identity, created: true };
  }
  const t = text.trim();
  if (!/^[0-9a-fA-F]{64}$/.test(t)) throw new Error(`identity file ${path} does not hold a seed (64 hex digits)`);
  return { identity: await Identity.fromSeed(new Uint8Array(Buffer.from(t, "hex"))), created: false };
}
export { FileCredentialStore } from "./node-credentials.js";
