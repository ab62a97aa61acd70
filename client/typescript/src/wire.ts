// The bodies of the relay protocol as they travel in JSON
// (docs/openapi.yaml, components.schemas). Field names are the wire's own.
// A Go test (client/typescript_test.go) holds every interface here to its
// schema: the same properties, and the same ones required.
//
// Seqs and cursors are JSON numbers: exact up to 2^53 - 1, far beyond what
// one device registration reaches.

/** A push target of a device (schema PushTarget). */
/** A Web Push subscription's keys, in unpadded base64url (schema PushKeys). */
export interface PushKeys {
  p256dh: string;
  auth: string;
}

export interface PushTarget {
  kind: "none" | "unifiedpush" | "webpush" | "apns" | "fcm";
  endpoint?: string;
  token?: string;
  /** APNs only: alert pushes with mutable-content, which a Notification Service Extension opens, instead of background pushes. */
  alert?: boolean;
  /** A Web Push subscription's keys, as PushSubscription.toJSON() writes them. */
  keys?: PushKeys;
  /** Written by PushSubscription.toJSON(); the relay ignores it. */
  expirationTime?: number | null;
}

/** POST /v1/register's body (schema RegisterRequest); every field optional. */
export interface RegisterRequest {
  push?: PushTarget;
  /** Standard base64 of a 32-byte Ed25519 public key. */
  identity_key?: string;
}

/** POST /v1/register's 200 (schema RegisterResponse). */
export interface RegisterResponse {
  household: string;
  device: string;
  cursor: number;
  /** The store's epoch cursor counts in (schema Epoch). */
  epoch: string;
}

/** POST /v1/send's body (schema SendRequest). */
export interface SendRequest {
  id: string;
  to: string[];
  /** Standard base64 with padding. */
  payload: string;
}

/** One recipient's copy of a send (schema Delivery). */
export interface Delivery {
  device: string;
  seq: number;
}

/** POST /v1/send's 202 (schema SendResponse). */
export interface SendResponse {
  id: string;
  deliveries: Delivery[];
}

/** One envelope of a poll's answer (schema Envelope). */
export interface Envelope {
  seq: number;
  id: string;
  from: string;
  /** RFC 3339 in UTC with six fractional digits, as the relay wrote it. */
  sent_at: string;
  /** Standard base64 with padding. */
  payload: string;
}

/** GET /v1/poll's 200 (schema PollResponse). */
export interface PollResponse {
  cursor: number;
  /** The store's epoch the seqs and cursor count in; send it with the next poll and ack. */
  epoch: string;
  more: boolean;
  envelopes: Envelope[];
}

/** POST /v1/ack's body (schema AckRequest). */
export interface AckRequest {
  cursor: number;
  /** The store's epoch the cursor was taken in; absent, not checked. */
  epoch?: string;
}

/** One device of the directory (schema Device). */
export interface Device {
  device: string;
  /** The kind of the device's push target; "none" without one. */
  push_kind: "none" | "unifiedpush" | "webpush" | "apns" | "fcm";
  /** Standard base64 of the registered Ed25519 public key; null without one. */
  identity_key: string | null;
  /** Standard base64 of its X25519 form; null without one. */
  x25519_key: string | null;
  registered_at: string;
  last_seen: string;
}

/** GET /v1/devices's 200 (schema DevicesResponse). */
export interface DevicesResponse {
  devices: Device[];
  /** Present when another page follows: pass it as after. */
  next?: string;
}

/** POST /v1/invitations's body (schema InvitationRequest); admin tokens only. */
export interface InvitationRequest {
  device: string;
  /** The paired device's tokens' scope (default "device"). */
  scope?: "device" | "admin";
  /** The device may exist: redeeming the invitation removes it first (otherwise a device of that name is 409 device_exists). */
  replace?: boolean;
}

/** POST /v1/invitations's 201 (schema InvitationResponse). */
export interface InvitationResponse {
  /** Single use; shown only here. */
  code: string;
  /**
   * The pairing link: <base>/pair/#code=<code>&household=<household> for a
   * device (the relay's page, which hands the code to the app), and
   * <base>/console/#pair=<code>&household=<household>&scope=admin for an
   * admin (the console).
   */
  url: string;
  household: string;
  device: string;
  scope: "device" | "admin";
  replace: boolean;
  expires_at: string;
}

/** One invitation in GET /v1/invitations (schema Invitation). */
export interface Invitation {
  device: string;
  scope: "device" | "admin";
  expires_at: string;
  /** null while pending. */
  redeemed_at: string | null;
  /** Standard base64 of the key the redeeming device gave, or null. */
  identity_key: string | null;
  /** Redeeming it removes the device of that name first. */
  replace: boolean;
  /** The device whose admin token made it. */
  created_by: string;
}

/** GET /v1/invitations's 200 (schema InvitationsResponse). */
export interface InvitationsResponse {
  invitations: Invitation[];
}

/** Every error answer's body (schema Error). */
export interface ErrorBody {
  error: string;
  message: string;
  /** cursor_ahead only: the device's head. */
  head?: number;
  /** cursor_ahead only: the store's current epoch, the one head counts in. */
  epoch?: string;
  /** 429 only: which limit refused. */
  limit?: string;
}

/** The data of a stream's last event (GET /v1/stream). */
export interface StreamEnd {
  reason: string;
  status?: number;
  error?: string;
  message?: string;
  head?: number;
  epoch?: string;
  limit?: string;
}
