// Web Push for a browser device: the page subscribes its service worker's
// push manager with the relay's VAPID key and registers the subscription
// as the device's push target, so that the relay wakes the worker when
// an envelope arrives and no poll is held (docs/PUSH.md, Web Push).
import type { RelayClient } from "./client.js";
import { decodeBase64URL } from "./base64.js";

/** The part of a ServiceWorkerRegistration that subscribeWebPush uses. */
export interface PushRegistration {
  pushManager: {
    getSubscription(): Promise<PushSubscriptionLike | null>;
    subscribe(options: { userVisibleOnly: boolean; applicationServerKey: ArrayBuffer }): Promise<PushSubscriptionLike>;
  };
}

/** The part of a PushSubscription that subscribeWebPush uses. */
export interface PushSubscriptionLike {
  readonly options?: { readonly applicationServerKey: ArrayBuffer | null };
  toJSON(): { endpoint?: string; expirationTime?: number | null; keys?: Record<string, string> };
  unsubscribe(): Promise<boolean>;
}

/**
 * Subscribes registration's push manager with the relay's VAPID key (a
 * subscription made with another key is dropped first: the relay could
 * not push to it) and registers the subscription as the device's webpush
 * target. Call it again when the worker hears pushsubscriptionchange.
 * Resolves to the subscription's toJSON().
 */
export async function subscribeWebPush(client: RelayClient, registration: PushRegistration, opts: { signal?: AbortSignal } = {}) {
  const key = decodeBase64URL(await client.vapidKey(opts));
  let sub = await registration.pushManager.getSubscription();
  const current = sub?.options?.applicationServerKey;
  if (sub && (!current || !sameBytes(new Uint8Array(current), key))) {
    await sub.unsubscribe();
    sub = null;
  }
  sub ??= await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key.slice().buffer });
  const json = sub.toJSON();
  if (!json.endpoint || !json.keys?.["p256dh"] || !json.keys?.["auth"]) throw new Error("relay client: the push subscription has no endpoint or keys");
  await client.register({ push: { kind: "webpush", endpoint: json.endpoint, keys: { p256dh: json.keys["p256dh"], auth: json.keys["auth"] } } }, opts);
  return json;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}
