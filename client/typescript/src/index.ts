// The relay client for browsers and Node 20+: nothing here imports a Node
// module (the Node-only cursor file is in ./node.js).
export { RelayClient, newId, DEFAULT_WAIT, MAX_ANSWER_BYTES } from "./client.js";
export { MAX_RETRY_AFTER_SECONDS } from "./backoff.js";
export type { ClientOptions, ConnectionState, Envelope, PollResult, PollOptions, SendOptions, Handler, ListenOptions, StreamOptions } from "./client.js";
export { RelayStream } from "./stream.js";
export type { StreamEvent, StreamEnd } from "./stream.js";
export { MemoryCursorStore } from "./cursor.js";
export type { CursorStore, Position } from "./cursor.js";
export { RelayError, NoAnswerError, StreamUnavailableError } from "./errors.js";
export type * as wire from "./wire.js";
export { Identity, SealError, SEAL_VERSION, seal, open, parseSealed, fingerprint, safetyNumber, keyId, x25519PublicKey, checkIdentityKey } from "./seal.js";
export type { SealErrorCode, SealParams, OpenParams, Recipient, Sealed } from "./seal.js";
export { Keyring, MemoryPinStore, LocalStoragePinStore } from "./keyring.js";
export type { PinStore, KeyChange, KeyringOptions } from "./keyring.js";
export { SealedClient, MemoryHeldStore, readDirectory } from "./sealed.js";
export type { DirectoryEntry, HeldStore, OpenedEnvelope, ListenSealedOptions } from "./sealed.js";
export type { SendResponse, RegisterResponse, RegisterRequest, PushTarget, Delivery, Device, DevicesResponse, InvitationRequest, InvitationResponse } from "./wire.js";
export { FixedToken, LocalStorageCredentialStore, MemoryCredentialStore, RenewingCredentials, UnauthorizedError, pair } from "./credentials.js";
export type { CredentialSource, CredentialStore, Credentials, KeyValueStorage, LockManagerLike, PairOptions, RenewingOptions } from "./credentials.js";
export { subscribeWebPush } from "./webpush.js";
export type { PushRegistration, PushSubscriptionLike } from "./webpush.js";
