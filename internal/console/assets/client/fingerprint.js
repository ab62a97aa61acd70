// Fingerprints of identity keys, for people to compare. A module of its
// own, on WebCrypto alone, so that a page which only shows fingerprints
// (the relay's console) loads none of the sealing dependencies.
const FINGERPRINT_LABEL = new TextEncoder().encode("fn-seal v1 fingerprint\0");
/**
 * The fingerprint of an Ed25519 public key, for people to compare: 30
 * digits in 6 groups of 5, from SHA-256("fn-seal v1 fingerprint" || 0 || key).
 */
export async function fingerprint(publicKey) {
    const data = new Uint8Array(FINGERPRINT_LABEL.length + publicKey.length);
    data.set(FINGERPRINT_LABEL);
    data.set(publicKey, FINGERPRINT_LABEL.length);
    const h = new Uint8Array(await crypto.subtle.digest("SHA-256", data));
    const groups = [];
    for (let i = 0; i < 6; i++) {
        let n = 0;
        // 40 bits: exact in a double.
        for (let j = 0; j < 5; j++)
            n = n * 256 + h[5 * i + j];
        groups.push(String(n % 100000).padStart(5, "0"));
    }
    return groups.join(" ");
}
