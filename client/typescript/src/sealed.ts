// Sealed envelopes over a relay: the directory read into a keyring, sends
// sealed to the recipients' pinned keys, and a listen loop that opens what
// it is handed.
import { decodeBase64, encodeBase64 } from "./base64.js";
import type { Envelope, ListenOptions, RelayClient, SendOptions } from "./client.js";
import type { KeyChange, Keyring } from "./keyring.js";
import { SealError, open, seal } from "./seal.js";
import type { Identity } from "./seal.js";
import type { PushTarget, SendResponse } from "./wire.js";

/** One device of the directory, keys decoded. */
export interface DirectoryEntry {
  device: string;
  /** The registered Ed25519 public key, or null. */
  identityKey: Uint8Array | null;
  /** Its X25519 form as the relay computed it, or null (never trusted: sealing derives it from identityKey). */
  x25519Key: Uint8Array | null;
  registeredAt: string;
  lastSeen: string;
}

/** The whole directory of the client's household, page after page. */
export async function readDirectory(client: RelayClient, opts: { pageSize?: number; signal?: AbortSignal } = {}): Promise<DirectoryEntry[]> {
  const out: DirectoryEntry[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await client.devices({
      ...(opts.pageSize !== undefined && { limit: opts.pageSize }),
      ...(after !== undefined && { after }),
      ...(opts.signal && { signal: opts.signal }),
    });
    for (const d of page.devices) {
      out.push({
        device: d.device,
        identityKey: d.identity_key === null ? null : decodeBase64(d.identity_key),
        x25519Key: d.x25519_key === null ? null : decodeBase64(d.x25519_key),
        registeredAt: d.registered_at,
        lastSeen: d.last_seen,
      });
    }
    if (page.next === undefined) return out;
    // Names come in order: a next that does not move forward would loop.
    if (after !== undefined && !(page.next > after)) throw new Error(`relay client: the directory's next page ${JSON.stringify(page.next)} does not follow ${JSON.stringify(after)}`);
    after = page.next;
  }
}

/** An envelope listenSealed hands over: opened, its plaintext beside it. */
export interface OpenedEnvelope extends Envelope {
  plaintext: Uint8Array;
}

export interface ListenSealedOptions extends ListenOptions {
  /**
   * An envelope that does not open (a SealError says why). Resolving skips
   * it (the default: the cursor moves past it); throwing
   * stops listen below it, so that it is handed over again. One refused as
   * key_changed is saved in held first, and handed to the handler, opened,
   * once the sender's new key is trusted (reopenHeld).
   */
  onRefused?: (envelope: Envelope, err: SealError) => void | Promise<void>;
  /**
   * Where envelopes refused as key_changed are kept while the cursor moves
   * past them (the relay then no longer has them); by default the
   * SealedClient's own memory, lost when the page or process ends:
   * FileHeldStore (Node) or a store of the app's keeps them across restarts.
   */
  held?: HeldStore;
}

/**
 * Keeps the sealed envelopes a SealedClient held back because their
 * sender's key differs from its pin, until that key is trusted
 * (reopenHeld) or the user drops them (dropHeld). save must be durable
 * when its promise resolves: listen saves before the cursor moves on.
 */
export interface HeldStore {
  /** The envelopes held; none when nothing was ever saved. */
  load(): Promise<Envelope[]>;
  save(envelopes: Envelope[]): Promise<void>;
}

/** Held envelopes in memory: for tests, and the default of listen. */
export class MemoryHeldStore implements HeldStore {
  private envelopes: Envelope[] = [];
  async load(): Promise<Envelope[]> {
    return [...this.envelopes];
  }
  async save(envelopes: Envelope[]): Promise<void> {
    this.envelopes = [...envelopes];
  }
}

/** The sender's id names a send; seqs may change after the relay's history went back. */
const sameEnvelope = (a: Envelope, b: Envelope) => a.from === b.from && a.id === b.id;

/**
 * A device that seals what it sends and opens what it receives: a relay
 * client, the device's identity and its keyring. Make one with register.
 */
export class SealedClient {
  /** listen's held store when its options name none. */
  readonly held: HeldStore = new MemoryHeldStore();
  /** One read-modify-write of a held store at a time. */
  private heldTurn: Promise<unknown> = Promise.resolve();

  private constructor(
    readonly client: RelayClient,
    readonly identity: Identity,
    readonly keyring: Keyring,
    readonly household: string,
    readonly device: string,
  ) {}

  /**
   * Registers the device with its identity key (and push target, if
   * given), pins that key for the device itself, then reads the directory
   * into the keyring: the client's household and device are the token's.
   */
  static async register(client: RelayClient, identity: Identity, keyring: Keyring, opts: { push?: PushTarget; signal?: AbortSignal } = {}): Promise<SealedClient> {
    const reg = await client.register(
      { identity_key: encodeBase64(identity.publicKey), ...(opts.push && { push: opts.push }) },
      opts.signal ? { signal: opts.signal } : {},
    );
    // The device's own key is the one it holds: a keyring that pinned an
    // earlier identity of this device would report its own new key as a
    // change and refuse what it seals to itself.
    const own = keyring.pinned(reg.device);
    if (own === undefined || !own.every((b, i) => b === identity.publicKey[i])) await keyring.trust(reg.device, identity.publicKey);
    const c = new SealedClient(client, identity, keyring, reg.household, reg.device);
    await c.refresh(opts.signal ? { signal: opts.signal } : {});
    return c;
  }

  /**
   * Reads the directory into the keyring: new keys are pinned, changed
   * ones reported (the keyring's onChange) and returned, never trusted.
   */
  async refresh(opts: { signal?: AbortSignal } = {}): Promise<KeyChange[]> {
    const changes: KeyChange[] = [];
    for (const d of await readDirectory(this.client, opts)) {
      const c = await this.keyring.see(d.device, d.identityKey);
      if (c) changes.push(c);
    }
    return changes;
  }

  /**
   * Trusts the key the directory lists now for device, replacing its pin
   * and resolving a reported change; returns that key. Call it only once
   * the users compared its fingerprint or safety number.
   */
  async trustListed(device: string, opts: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const entry = (await readDirectory(this.client, opts)).find((d) => d.device === device);
    if (!entry?.identityKey) throw new Error(`relay client: the directory lists no key for ${device}`);
    await this.keyring.trust(device, entry.identityKey);
    return entry.identityKey;
  }

  /** Seals plaintext for the devices in to (their pinned keys, in that order). */
  async seal(id: string, to: string[], plaintext: Uint8Array | string): Promise<Uint8Array> {
    const bytes = typeof plaintext === "string" ? new TextEncoder().encode(plaintext) : plaintext;
    const devices = [...new Set(to)]; // the relay collapses repeats too
    if (devices.some((d) => this.keyring.pinned(d) === undefined)) await this.refresh(); // a device registered since
    const recipients = devices.map((device) => ({ device, key: this.keyring.sealKey(device) }));
    return seal({ household: this.household, id, sender: this.device, identity: this.identity, recipients }, bytes);
  }

  /**
   * Seals plaintext for to and sends it with id, retrying as send does.
   * It rejects with a SealError (key_changed, unknown_sender) before
   * sending anything to a device whose key is not trusted. A retry after a
   * restart must send the same sealed bytes (seal, persist, send), or the
   * relay refuses the repeated id (409 id_conflict).
   */
  async sendSealed(id: string, to: string[], plaintext: Uint8Array | string, opts: Omit<SendOptions, "id"> = {}): Promise<SendResponse> {
    const sealed = await this.seal(id, to, plaintext);
    return this.client.send(to, sealed, { ...opts, id });
  }

  /**
   * Opens a delivered envelope. On unknown_sender or key_changed the
   * directory is read once and the envelope opened again: a sender may
   * have registered since the last refresh, and a changed key is then
   * reported to the app (the keyring's onChange), still not trusted.
   */
  async open(e: Envelope): Promise<Uint8Array> {
    const params = { household: this.household, id: e.id, from: e.from, device: this.device, identity: this.identity, pinned: (d: string) => this.keyring.pinned(d) };
    try {
      return await open(e.payload, params);
    } catch (err) {
      if (!(err instanceof SealError && (err.code === "unknown_sender" || err.code === "key_changed"))) throw err;
    }
    await this.refresh();
    return open(e.payload, params);
  }

  /** Runs f after every earlier held-store update has settled. */
  private withHeld<T>(f: () => Promise<T>): Promise<T> {
    const run = this.heldTurn.then(f, f);
    this.heldTurn = run.catch(() => {});
    return run;
  }

  /**
   * The client's listen, each envelope opened before handler sees it (see
   * ListenSealedOptions.onRefused). What held keeps from earlier runs is
   * reopened first (reopenHeld).
   */
  async listen(handler: (e: OpenedEnvelope, signal: AbortSignal) => void | Promise<void>, opts: ListenSealedOptions = {}): Promise<void> {
    const { onRefused, held = this.held, ...listenOpts } = opts;
    await this.reopenHeld(handler, { held, ...(onRefused && { onRefused }), ...(opts.signal && { signal: opts.signal }) });
    return this.client.listen(async (e, signal) => {
      let plaintext: Uint8Array;
      try {
        plaintext = await this.open(e);
      } catch (err) {
        if (!(err instanceof SealError)) throw err;
        if (err.code === "key_changed") await this.withHeld(async () => {
          const es = await held.load();
          if (!es.some((x) => sameEnvelope(x, e))) await held.save([...es, e]);
        });
        if (onRefused) await onRefused(e, err);
        return;
      }
      await handler({ ...e, plaintext }, signal);
    }, listenOpts);
  }

  /**
   * Opens again each envelope held kept back, as an app does after
   * trustListed: those that open now go to handler, those refused for
   * another reason than key_changed to onRefused, in the order they were
   * held, and each leaves held once its callback resolved; the others stay.
   * It stops, resolving, when the signal aborts.
   */
  reopenHeld(
    handler: (e: OpenedEnvelope, signal: AbortSignal) => void | Promise<void>,
    opts: { held?: HeldStore; onRefused?: (envelope: Envelope, err: SealError) => void | Promise<void>; signal?: AbortSignal } = {},
  ): Promise<void> {
    const held = opts.held ?? this.held;
    const signal = opts.signal ?? new AbortController().signal;
    return this.withHeld(async () => {
      const es = await held.load();
      for (let i = 0; i < es.length && !signal.aborted; ) {
        const e = es[i]!;
        let plaintext: Uint8Array | undefined;
        try {
          plaintext = await this.open(e);
        } catch (err) {
          if (!(err instanceof SealError)) throw err;
          if (err.code === "key_changed") {
            i++;
            continue;
          }
          if (opts.onRefused) await opts.onRefused(e, err);
        }
        if (plaintext) await handler({ ...e, plaintext }, signal);
        es.splice(i, 1);
        await held.save(es);
      }
    });
  }

  /** Discards what held keeps from device (from every device without one); resolves to how many went. */
  dropHeld(device?: string, opts: { held?: HeldStore } = {}): Promise<number> {
    const held = opts.held ?? this.held;
    return this.withHeld(async () => {
      const es = await held.load();
      const kept = es.filter((e) => device !== undefined && e.from !== device);
      if (kept.length !== es.length) await held.save(kept);
      return es.length - kept.length;
    });
  }
}
