// Sealed envelopes, format v1 (docs/E2E.md): a payload that only the
// devices it names can open, signed by its sender's identity key. Built on
// WebCrypto (Ed25519, X25519, AES-256-GCM, SHA-2) and HPKE (RFC 9180,
// @hpke/core); @noble/curves only converts an Ed25519 public key to its
// X25519 form, which WebCrypto cannot do.
import { Aes256Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from "@hpke/core";
import { ed25519 } from "@noble/curves/ed25519.js";
import { fingerprint } from "./fingerprint.js";

export { fingerprint };

/** Why an envelope could not be opened or sealed; `code` names the check that refused it. */
export type SealErrorCode =
  | "malformed"
  | "version"
  | "wrong_household"
  | "wrong_id"
  | "wrong_sender"
  | "unknown_sender"
  | "key_changed"
  | "signature"
  | "not_addressed"
  | "decrypt";

export class SealError extends Error {
  override readonly name = "SealError";
  constructor(
    readonly code: SealErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(`seal: ${code}: ${message}`, options);
  }
}

const MAGIC = [0x46, 0x4e, 0x45]; // "FNE"
/** The format's version: the magic's fourth byte. */
export const SEAL_VERSION = 1;
const KEY_BYTES = 32;
const KEY_ID_BYTES = 8;
const ENC_BYTES = 32;
const WRAPPED_BYTES = 48; // 32-byte content key + 16-byte tag
const NONCE_BYTES = 12;
const SIG_BYTES = 64;
const MAX_RECIPIENTS = 255;

const utf8 = new TextEncoder();
const SIG_LABEL = utf8.encode("fn-seal v1 sig\0");
const KEY_LABEL = utf8.encode("fn-seal v1 key\0");

// PKCS#8 wrappers of a raw 32-byte private key (RFC 8410): WebCrypto
// imports Ed25519 and X25519 private keys in this form, not raw.
const PKCS8_ED25519 = hex("302e020100300506032b657004220420");
const PKCS8_X25519 = hex("302e020100300506032b656e04220420");

const suite = new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes256Gcm() });

/** A fresh copy backed by its own ArrayBuffer, as WebCrypto's types want. */
function own(b: Uint8Array): Uint8Array<ArrayBuffer> {
  return new Uint8Array(b);
}

function concat(...parts: Uint8Array[]): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function hex(s: string): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let d = 0;
  for (let i = 0; i < a.length; i++) d |= a[i]! ^ b[i]!;
  return d === 0;
}

function str8(s: string): Uint8Array {
  const b = utf8.encode(s);
  if (b.length > 255) throw new Error(`seal: ${JSON.stringify(s.slice(0, 20))}... is longer than 255 bytes`);
  return concat(new Uint8Array([b.length]), b);
}

/** A household or device name of the protocol: 1 to 64 of A-Z a-z 0-9 . _ - */
function validName(s: string): boolean {
  return /^[A-Za-z0-9._-]{1,64}$/.test(s);
}

/** A send id of the protocol: 1 to 128 printable ASCII characters. */
function validId(s: string): boolean {
  return /^[\x20-\x7e]{1,128}$/.test(s);
}

async function sha(alg: "SHA-256" | "SHA-512", data: Uint8Array): Promise<Uint8Array<ArrayBuffer>> {
  return new Uint8Array(await crypto.subtle.digest(alg, own(data)));
}

/** The key id of an Ed25519 public key: the first 8 bytes of its SHA-256. */
export async function keyId(publicKey: Uint8Array): Promise<Uint8Array> {
  return (await sha("SHA-256", publicKey)).slice(0, KEY_ID_BYTES);
}

/**
 * The X25519 public key of an Ed25519 public key: its Montgomery form
 * u = (1+y)/(1-y), as libsodium's crypto_sign_ed25519_pk_to_curve25519.
 * Throws when the bytes are not a point of the curve.
 */
export function x25519PublicKey(edPublicKey: Uint8Array): Uint8Array {
  checkIdentityKey(edPublicKey);
  return ed25519.utils.toMontgomery(edPublicKey);
}

/**
 * Throws unless key can be an identity key, as the Go client and the relay
 * decide (seal/testdata/keys): 32 bytes, the canonical encoding of a
 * curve point, and not of small order (whose X25519 form, 00... or 01...,
 * would make every shared secret known).
 */
export function checkIdentityKey(key: Uint8Array): void {
  if (key.length !== KEY_BYTES) throw new Error(`seal: an Ed25519 public key is ${KEY_BYTES} bytes, not ${key.length}`);
  let p;
  try {
    p = ed25519.Point.fromBytes(key, false); // RFC 8032's strict decoding
  } catch (e) {
    throw new Error("seal: the key is not a point of the curve", { cause: e });
  }
  const again = p.toBytes();
  if (again.some((b, i) => b !== key[i])) throw new Error("seal: the key is not a canonical encoding of its point");
  if (p.isSmallOrder()) throw new Error("seal: the key has small order");
}

/**
 * A device's identity: an Ed25519 key pair and the X25519 key pair derived
 * from it. The 32-byte seed is the secret to persist; everything else
 * follows from it.
 */
export class Identity {
  private constructor(
    /** The secret: persist it, and nothing else. */
    readonly seed: Uint8Array,
    /** The Ed25519 public key, as registered in the directory (identity_key). */
    readonly publicKey: Uint8Array,
    /** Its X25519 form, the HPKE recipient key. */
    readonly x25519PublicKey: Uint8Array,
    private readonly signingKey: CryptoKey,
    private readonly hpkeKey: CryptoKeyPair,
  ) {}

  /** A new identity from 32 random bytes. */
  static generate(): Promise<Identity> {
    return Identity.fromSeed(crypto.getRandomValues(new Uint8Array(KEY_BYTES)));
  }

  /** The identity of a persisted seed. */
  static async fromSeed(seed: Uint8Array): Promise<Identity> {
    if (seed.length !== KEY_BYTES) throw new Error(`seal: a seed is ${KEY_BYTES} bytes, not ${seed.length}`);
    seed = own(seed);
    const signingKey = await crypto.subtle.importKey("pkcs8", concat(PKCS8_ED25519, seed), { name: "Ed25519" }, true, ["sign"]);
    const jwk = await crypto.subtle.exportKey("jwk", signingKey);
    const publicKey = fromBase64URL(jwk.x ?? "");
    // libsodium's crypto_sign_ed25519_sk_to_curve25519: the first half of
    // SHA-512(seed), which X25519 clamps as Ed25519 does.
    const h = await sha("SHA-512", seed);
    const scalar = h.slice(0, KEY_BYTES);
    h.fill(0);
    const xPrivate = await crypto.subtle.importKey("pkcs8", concat(PKCS8_X25519, scalar), { name: "X25519" }, false, ["deriveBits"]);
    scalar.fill(0);
    const xPublicBytes = x25519PublicKey(publicKey);
    const xPublic = await crypto.subtle.importKey("raw", own(xPublicBytes), { name: "X25519" }, true, []);
    return new Identity(seed, publicKey, xPublicBytes, signingKey, { privateKey: xPrivate, publicKey: xPublic });
  }

  /**
   * @internal An Ed25519 signature of data as it is: only seal's own
   * labelled messages, and the tests, ever reach it (stripped from the
   * published types).
   */
  async sign(data: Uint8Array): Promise<Uint8Array> {
    return new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, this.signingKey, own(data)));
  }

  /** @internal Opens an HPKE-sealed content key addressed to this identity. */
  async unwrap(enc: Uint8Array, wrapped: Uint8Array, info: Uint8Array): Promise<Uint8Array> {
    return new Uint8Array(await suite.open({ recipientKey: this.hpkeKey, enc: own(enc), info: own(info) }, own(wrapped)));
  }
}

function fromBase64URL(s: string): Uint8Array {
  const b = atob(s.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (s.length % 4)) % 4));
  return Uint8Array.from(b, (c) => c.charCodeAt(0));
}

/** The safety number of two devices' keys: both fingerprints, sorted, joined; the same on both sides. */
export async function safetyNumber(a: Uint8Array, b: Uint8Array): Promise<string> {
  const fs = [await fingerprint(a), await fingerprint(b)].sort();
  return fs.join(" ");
}

/** One recipient of a sealed envelope: its device name and pinned Ed25519 public key. */
export interface Recipient {
  device: string;
  key: Uint8Array;
}

export interface SealParams {
  household: string;
  /** The id the envelope is sent with (POST /v1/send). */
  id: string;
  /** The sending device's name. */
  sender: string;
  identity: Identity;
  /** The devices that may open it, in this order, names unique. */
  recipients: Recipient[];
}

function slotInfo(household: string, id: string, sender: string, senderKey: Uint8Array, recipient: string, kid: Uint8Array): Uint8Array {
  return concat(KEY_LABEL, str8(household), str8(id), str8(sender), senderKey, str8(recipient), kid);
}

/**
 * Seals plaintext for the recipients: a fresh content key encrypts it
 * (AES-256-GCM, the header as associated data), HPKE wraps that key for
 * each recipient, and the sender's identity signs the whole.
 */
export async function seal(p: SealParams, plaintext: Uint8Array): Promise<Uint8Array> {
  if (!validName(p.household)) throw new Error(`seal: household ${JSON.stringify(p.household)} is not a valid name`);
  if (!validName(p.sender)) throw new Error(`seal: sender ${JSON.stringify(p.sender)} is not a valid name`);
  if (!validId(p.id)) throw new Error(`seal: id ${JSON.stringify(p.id)} is not a valid send id`);
  if (p.recipients.length < 1 || p.recipients.length > MAX_RECIPIENTS) throw new Error(`seal: 1 to ${MAX_RECIPIENTS} recipients, not ${p.recipients.length}`);
  const seen = new Set<string>();
  for (const r of p.recipients) {
    if (!validName(r.device)) throw new Error(`seal: recipient ${JSON.stringify(r.device)} is not a valid name`);
    if (seen.has(r.device)) throw new Error(`seal: recipient ${r.device} is named twice`);
    seen.add(r.device);
  }
  const senderKey = p.identity.publicKey;
  const contentKey = crypto.getRandomValues(new Uint8Array(KEY_BYTES));
  const parts: Uint8Array[] = [new Uint8Array([...MAGIC, SEAL_VERSION]), str8(p.household), str8(p.id), str8(p.sender), senderKey, new Uint8Array([p.recipients.length])];
  for (const r of p.recipients) {
    let xKey: CryptoKey;
    try {
      xKey = await suite.kem.importKey("raw", own(x25519PublicKey(r.key)).buffer, true);
    } catch (e) {
      throw new Error(`seal: recipient ${r.device}: the key is not an Ed25519 public key`, { cause: e });
    }
    const kid = await keyId(r.key);
    const { ct, enc } = await suite.seal({ recipientPublicKey: xKey, info: own(slotInfo(p.household, p.id, p.sender, senderKey, r.device, kid)) }, contentKey);
    parts.push(str8(r.device), kid, new Uint8Array(enc), new Uint8Array(ct));
  }
  const nonce = crypto.getRandomValues(new Uint8Array(NONCE_BYTES));
  parts.push(nonce);
  const header = concat(...parts);
  const aes = await crypto.subtle.importKey("raw", contentKey, { name: "AES-GCM" }, false, ["encrypt"]);
  contentKey.fill(0);
  const ciphertext = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-GCM", iv: nonce, additionalData: header }, aes, own(plaintext)));
  const length = new Uint8Array(4);
  new DataView(length.buffer).setUint32(0, ciphertext.length);
  const signed = concat(header, length, ciphertext);
  const signature = await p.identity.sign(concat(SIG_LABEL, signed));
  return concat(signed, signature);
}

/** A sealed envelope's parts, as read by parseSealed. */
export interface Sealed {
  household: string;
  id: string;
  sender: string;
  senderKey: Uint8Array;
  slots: { recipient: string; keyId: Uint8Array; enc: Uint8Array; wrapped: Uint8Array }[];
  nonce: Uint8Array;
  /** The header's bytes: the content's associated data. */
  header: Uint8Array;
  ciphertext: Uint8Array;
  /** What the signature covers: header and body. */
  signed: Uint8Array;
  signature: Uint8Array;
}

/**
 * Reads a sealed envelope strictly: every length within the bytes, names
 * valid, recipients unique, nothing after the signature. It checks no key
 * and no signature: open does.
 */
export function parseSealed(b: Uint8Array): Sealed {
  let at = 0;
  const bad = (what: string): never => {
    throw new SealError("malformed", what);
  };
  const take = (n: number, what: string): Uint8Array => {
    if (at + n > b.length) bad(`${what} runs past the end`);
    const out = b.subarray(at, at + n);
    at += n;
    return out;
  };
  const name = (what: string, valid: (s: string) => boolean): string => {
    const n = take(1, what)[0]!;
    const raw = take(n, what);
    // Valid names are ASCII: read byte for byte, so no UTF-8 decoding
    // can make an invalid byte look valid.
    const s = String.fromCharCode(...raw);
    if (!valid(s)) bad(`${what} is not a valid name`);
    return s;
  };
  if (b.length < 4 || b[0] !== MAGIC[0] || b[1] !== MAGIC[1] || b[2] !== MAGIC[2]) bad("not a sealed envelope (magic)");
  if (b[3] !== SEAL_VERSION) throw new SealError("version", `format version ${b[3]}, this client reads ${SEAL_VERSION}`);
  at = 4;
  const household = name("household", validName);
  const id = name("id", validId);
  const sender = name("sender", validName);
  const senderKey = take(KEY_BYTES, "sender key");
  const count = take(1, "recipient count")[0]!;
  if (count < 1) bad("no recipients");
  const slots: Sealed["slots"] = [];
  const names = new Set<string>();
  for (let i = 0; i < count; i++) {
    const recipient = name("recipient", validName);
    if (names.has(recipient)) bad(`recipient ${recipient} is named twice`);
    names.add(recipient);
    slots.push({ recipient, keyId: take(KEY_ID_BYTES, "key id"), enc: take(ENC_BYTES, "enc"), wrapped: take(WRAPPED_BYTES, "wrapped key") });
  }
  const nonce = take(NONCE_BYTES, "nonce");
  const header = b.subarray(0, at);
  const lenBytes = take(4, "length");
  const length = new DataView(lenBytes.buffer, lenBytes.byteOffset, 4).getUint32(0);
  const ciphertext = take(length, "ciphertext");
  const signed = b.subarray(0, at);
  const signature = take(SIG_BYTES, "signature");
  if (at !== b.length) bad(`${b.length - at} bytes after the signature`);
  return { household, id, sender, senderKey, slots, nonce, header, ciphertext, signed, signature };
}

export interface OpenParams {
  /** The opener's household. */
  household: string;
  /** The delivered envelope's id. */
  id: string;
  /** The delivered envelope's sender, as the relay named it. */
  from: string;
  /** The opener's device name. */
  device: string;
  identity: Identity;
  /** The key pinned for a device, if any (a Keyring's pinned). */
  pinned: (device: string) => Uint8Array | undefined;
}

/**
 * Opens a sealed envelope, checking in the format's order: the layout,
 * household, id and sender against the delivery, the sender's key against
 * its pin, the signature, the opener's slot, then decryption. Each failure
 * is a SealError with its own code.
 */
export async function open(sealed: Uint8Array, p: OpenParams): Promise<Uint8Array> {
  const s = parseSealed(sealed);
  if (s.household !== p.household) throw new SealError("wrong_household", `sealed for household ${s.household}, opened in ${p.household}`);
  if (s.id !== p.id) throw new SealError("wrong_id", `sealed as id ${JSON.stringify(s.id)}, delivered as ${JSON.stringify(p.id)}`);
  if (s.sender !== p.from) throw new SealError("wrong_sender", `sealed by ${s.sender}, delivered as from ${p.from}`);
  const pin = p.pinned(s.sender);
  if (pin === undefined) throw new SealError("unknown_sender", `no key pinned for ${s.sender}`);
  if (!equal(pin, s.senderKey)) throw new SealError("key_changed", `${s.sender} sealed with another key than the one pinned`);
  let ok = false;
  try {
    const key = await crypto.subtle.importKey("raw", own(s.senderKey), { name: "Ed25519" }, false, ["verify"]);
    ok = await crypto.subtle.verify({ name: "Ed25519" }, key, own(s.signature), concat(SIG_LABEL, s.signed));
  } catch (e) {
    throw new SealError("signature", "the sender's key cannot verify", { cause: e });
  }
  if (!ok) throw new SealError("signature", `not signed by ${s.sender}'s key`);
  const kid = await keyId(p.identity.publicKey);
  const slot = s.slots.find((x) => x.recipient === p.device && equal(x.keyId, kid));
  if (!slot) throw new SealError("not_addressed", `not sealed for ${p.device} with its key`);
  try {
    const contentKey = await p.identity.unwrap(slot.enc, slot.wrapped, slotInfo(s.household, s.id, s.sender, s.senderKey, slot.recipient, slot.keyId));
    const aes = await crypto.subtle.importKey("raw", own(contentKey), { name: "AES-GCM" }, false, ["decrypt"]);
    contentKey.fill(0);
    return new Uint8Array(await crypto.subtle.decrypt({ name: "AES-GCM", iv: own(s.nonce), additionalData: own(s.header) }, aes, own(s.ciphertext)));
  } catch (e) {
    throw new SealError("decrypt", "the content key or the content does not decrypt", { cause: e });
  }
}
