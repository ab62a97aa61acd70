// The relay client for browsers and Node 20+: nothing here imports a Node
// module (the Node-only cursor file is in ./node.js).
export { RelayClient, newId, DEFAULT_WAIT, MAX_ANSWER_BYTES } from "./client.js";
export { MAX_RETRY_AFTER_SECONDS } from "./backoff.js";
export type { ClientOptions, Envelope, PollResult, PollOptions, SendOptions, Handler, ListenOptions } from "./client.js";
export { MemoryCursorStore } from "./cursor.js";
export type { CursorStore } from "./cursor.js";
export { RelayError, NoAnswerError } from "./errors.js";
export type * as wire from "./wire.js";
export type { SendResponse, RegisterResponse, RegisterRequest, PushTarget, Delivery } from "./wire.js";
