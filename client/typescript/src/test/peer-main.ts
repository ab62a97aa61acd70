// Runs one interoperability peer in Node: a PeerJob as JSON on stdin, its
// PeerResult as one JSON line on stdout (test/clients/seal_test.go drives it).
import { runPeer } from "./peer.js";
import type { PeerJob } from "./peer.js";

const chunks: Buffer[] = [];
for await (const c of process.stdin) chunks.push(c as Buffer);
const job = JSON.parse(Buffer.concat(chunks).toString("utf8")) as PeerJob;
process.stdout.write(JSON.stringify(await runPeer(job)) + "\n");
