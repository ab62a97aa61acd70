// The keys a device trusts: one pinned Ed25519 public key per device of its
// household, pinned on first sight (trust on first use). A directory key
// that differs from the pin is reported to the app and never sealed to
// until the app trusts it.
import { decodeBase64, encodeBase64 } from "./base64.js";
import { SealError, x25519PublicKey } from "./seal.js";

/**
 * Where a keyring keeps its pins: one string (JSON), loaded once and saved
 * after each change. save must be durable when its promise resolves.
 */
export interface PinStore {
  /** The saved string; undefined when nothing was ever saved. */
  load(): Promise<string | undefined>;
  save(data: string): Promise<void>;
}

/** Pins in memory: for tests, and for apps that keep them elsewhere. */
export class MemoryPinStore implements PinStore {
  constructor(public data: string | undefined = undefined) {}
  async load(): Promise<string | undefined> {
    return this.data;
  }
  async save(data: string): Promise<void> {
    this.data = data;
  }
}

/** Pins in a browser's localStorage (or any Storage), under one item. */
export class LocalStoragePinStore implements PinStore {
  constructor(
    readonly item = "relay-pins",
    private readonly storage: Storage = globalThis.localStorage,
  ) {
    if (!storage) throw new Error("keyring: no localStorage here");
  }
  async load(): Promise<string | undefined> {
    return this.storage.getItem(this.item) ?? undefined;
  }
  async save(data: string): Promise<void> {
    this.storage.setItem(this.item, data);
  }
}

/** A directory key that differs from the device's pin. */
export interface KeyChange {
  device: string;
  /** The key still trusted. */
  pinned: Uint8Array;
  /** The key the directory now lists; trust(device, seen) accepts it. */
  seen: Uint8Array;
}

export interface KeyringOptions {
  /** Called once for each new change the directory shows (device, key). */
  onChange?: (change: KeyChange) => void;
}

interface Saved {
  format: 1;
  pins: Record<string, string>;
  changed: Record<string, string>;
}

function sameKey(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/** Throws unless key is a 32-byte Ed25519 public key (a point of the curve). */
function checkKey(device: string, key: Uint8Array): void {
  try {
    x25519PublicKey(key);
  } catch (e) {
    throw new Error(`keyring: ${device}'s key is not an Ed25519 public key`, { cause: e });
  }
}

export class Keyring {
  private readonly pins = new Map<string, Uint8Array>();
  private readonly changed = new Map<string, Uint8Array>();
  private saving: Promise<void> = Promise.resolve();

  private constructor(
    private readonly store: PinStore,
    private readonly onChange: (change: KeyChange) => void,
  ) {}

  /** The keyring the store holds (empty if it holds nothing). */
  static async load(store: PinStore, opts: KeyringOptions = {}): Promise<Keyring> {
    const k = new Keyring(store, opts.onChange ?? (() => {}));
    const data = await store.load();
    if (data === undefined) return k;
    let v: Saved;
    try {
      v = JSON.parse(data) as Saved;
      if (v.format !== 1 || typeof v.pins !== "object" || typeof v.changed !== "object") throw new Error("not a keyring");
      for (const [d, key] of Object.entries(v.pins)) k.pins.set(d, decodeBase64(key));
      for (const [d, key] of Object.entries(v.changed)) k.changed.set(d, decodeBase64(key));
    } catch (e) {
      throw new Error(`keyring: the store holds no keyring: ${(e as Error).message}`, { cause: e });
    }
    return k;
  }

  /** The key pinned for device, if any. */
  pinned(device: string): Uint8Array | undefined {
    return this.pins.get(device);
  }

  /** The changes not yet resolved by trust, in device order. */
  changes(): KeyChange[] {
    return [...this.changed.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([device, seen]) => ({ device, pinned: this.pins.get(device)!, seen }));
  }

  /**
   * The key to seal to for device: its pin, unless the directory showed
   * another key that the app has not trusted yet (key_changed) or nothing
   * is pinned (unknown_sender).
   */
  sealKey(device: string): Uint8Array {
    const pin = this.pins.get(device);
    if (pin === undefined) throw new SealError("unknown_sender", `no key pinned for ${device}`);
    if (this.changed.has(device)) throw new SealError("key_changed", `${device}'s key changed in the directory; trust it (after comparing safety numbers) before sealing to it`);
    return pin;
  }

  /**
   * What the directory lists for device: a key never pinned is pinned; a
   * key other than the pin is kept aside and reported (once per key), the
   * pin unchanged. A device without a key changes nothing. Resolves once
   * saved; returns the change, if this is one.
   */
  async see(device: string, key: Uint8Array | null): Promise<KeyChange | undefined> {
    if (key === null) return undefined;
    checkKey(device, key);
    const pin = this.pins.get(device);
    if (pin === undefined) {
      this.pins.set(device, new Uint8Array(key));
      await this.save();
      return undefined;
    }
    if (sameKey(pin, key)) return undefined;
    const change: KeyChange = { device, pinned: pin, seen: new Uint8Array(key) };
    const before = this.changed.get(device);
    if (before !== undefined && sameKey(before, key)) return change;
    this.changed.set(device, change.seen);
    await this.save();
    this.onChange(change);
    return change;
  }

  /** Pins key for device (the app has checked it, by safety number), replacing any pin and resolving its change. */
  async trust(device: string, key: Uint8Array): Promise<void> {
    checkKey(device, key);
    this.pins.set(device, new Uint8Array(key));
    this.changed.delete(device);
    await this.save();
  }

  /** Saves the current state; saves run one after the other, so the last one written is the newest. */
  private save(): Promise<void> {
    const run = async () => {
      // fromEntries defines own properties: a device named __proto__ stays a pin.
      const enc = (m: Map<string, Uint8Array>) => Object.fromEntries([...m].map(([d, key]) => [d, encodeBase64(key)]));
      const v: Saved = { format: 1, pins: enc(this.pins), changed: enc(this.changed) };
      await this.store.save(JSON.stringify(v));
    };
    const next = this.saving.then(run, run);
    this.saving = next;
    return next;
  }
}
