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
   * stops listen below it, so that it is handed over again, say after the
   * app trusted a changed key.
   */
  onRefused?: (envelope: Envelope, err: SealError) => void | Promise<void>;
}

/**
 * A device that seals what it sends and opens what it receives: a relay
 * client, the device's identity and its keyring. Make one with register.
 */
export class SealedClient {
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

  /** The client's listen, each envelope opened before handler sees it (see ListenSealedOptions.onRefused). */
  listen(handler: (e: OpenedEnvelope, signal: AbortSignal) => void | Promise<void>, opts: ListenSealedOptions = {}): Promise<void> {
    const { onRefused, ...listenOpts } = opts;
    return this.client.listen(async (e, signal) => {
      let plaintext: Uint8Array;
      try {
        plaintext = await this.open(e);
      } catch (err) {
        if (!(err instanceof SealError)) throw err;
        if (onRefused) await onRefused(e, err);
        return;
      }
      await handler({ ...e, plaintext }, signal);
    }, listenOpts);
  }
}
