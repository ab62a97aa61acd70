// Decrypts a Web Push body with http_ece, an implementation independent of
// the relay's, as a browser would: with the subscription's private key and
// auth secret. Reads {"body", "private", "auth"} (base64url) on stdin and
// writes the plaintext to stdout; fails when the body does not open.
const crypto = require("node:crypto");
const ece = require("http_ece");

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const { body, private: priv, auth } = JSON.parse(input);
  const ua = crypto.createECDH("prime256v1");
  ua.setPrivateKey(Buffer.from(priv, "base64url"));
  const plain = ece.decrypt(Buffer.from(body, "base64url"), {
    version: "aes128gcm",
    privateKey: ua,
    authSecret: Buffer.from(auth, "base64url"),
  });
  process.stdout.write(plain);
});
