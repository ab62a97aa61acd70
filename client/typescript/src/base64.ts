// Standard base64 (with padding) and base64url (without) over bytes, with
// only what browsers and Node share: btoa and atob.

const CHUNK = 0x8000;

function binary(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += CHUNK) {
    s += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  }
  return s;
}

export function encodeBase64(bytes: Uint8Array): string {
  return btoa(binary(bytes));
}

export function decodeBase64(s: string): Uint8Array {
  const b = atob(s);
  const out = new Uint8Array(b.length);
  for (let i = 0; i < b.length; i++) out[i] = b.charCodeAt(i);
  return out;
}

export function encodeBase64URL(bytes: Uint8Array): string {
  return encodeBase64(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function decodeBase64URL(s: string): Uint8Array {
  const std = s.replace(/-/g, "+").replace(/_/g, "/");
  return decodeBase64(std + "=".repeat((4 - (std.length % 4)) % 4));
}
