#!/usr/bin/env node
// The client's command line: `send` and `listen`, with the same flags and
// output as the relay binary's own `relay send` and `relay listen`, so
// that one conformance test drives either. JSON only: -codec msgpack is
// refused (exit 2).
import { readFile } from "node:fs/promises";

import { RelayClient, newId } from "./client.js";
import { RelayError } from "./errors.js";
import type { Envelope } from "./client.js";
import { MemoryCursorStore } from "./cursor.js";
import { encodeBase64 } from "./base64.js";
import { Keyring } from "./keyring.js";
import { FileCursorStore, FileHeldStore, FilePinStore, loadIdentity } from "./node.js";
import { fingerprint } from "./seal.js";
import { SealedClient } from "./sealed.js";
import { RenewingCredentials, pair } from "./credentials.js";
import { FileCredentialStore } from "./node-credentials.js";

const USAGE = `usage:
  cli.js send [flags] -to dev1,dev2 [-id ID] [-timeout 60s] [-seal] [PAYLOAD | -file F | -]
  cli.js listen [flags] [-cursor-file F] [-wait 20] [-count N] [-open]
  cli.js pair -url URL -code CODE -store FILE [-identity F]
common flags:
  -seal           send: seal the payload to the recipients' pinned keys
  -open           listen: open sealed envelopes: "payload" is the plaintext,
                  or null with "error" saying why it did not open
  -identity F     with -seal/-open, and pair: the device's seed file, created 0600
                  when missing; pair publishes its key and prints its fingerprint
  -keyring F      with -seal/-open: the pinned keys (default: the identity file + .pins)
  -trust D1,D2    with -seal/-open: these devices' keys, as the directory lists
                  them now, replace their pins (compare the fingerprints first)
  -drop D1,D2     with -open: discard these devices' held-back envelopes
listen acknowledges the saved cursor before it exits (-count, SIGINT,
SIGTERM). With -open, an envelope sealed with a sender key that changed is
printed with error key_changed and kept in the identity file + .held; it is
printed again, opened, once -trust names its sender, unless -drop drops it.
  -url URL        relay base URL (env FN_RELAY_URL, default http://127.0.0.1:8080)
  -token T        bearer token; else -token-file F; else env FN_TOKEN
  -token-file F   file holding the token
  -store F        credentials file written by pair, renewed as needed (instead of a token)
  -codec json     the only codec of this command line`;

/** A mistake on the command line: exit 2. */
class UsageError extends Error {}

type Flags = Map<string, string>;

/**
 * Parses flags as Go's flag package does: -name value, -name=value, a
 * leading "--" allowed; flags end at the first argument that is not one,
 * at a lone "-", or after "--".
 */
function parseFlags(args: string[], known: string[], bools: string[] = []): { flags: Flags; rest: string[] } {
  const flags: Flags = new Map();
  let i = 0;
  for (; i < args.length; i++) {
    const a = args[i]!;
    if (a === "--") {
      i++;
      break;
    }
    if (a.length < 2 || a[0] !== "-") break;
    let name = a.slice(a[1] === "-" ? 2 : 1);
    let value: string | undefined;
    const eq = name.indexOf("=");
    if (eq >= 0) {
      value = name.slice(eq + 1);
      name = name.slice(0, eq);
    }
    if (name === "h" || name === "help") throw new UsageError("");
    if (!known.includes(name) && !bools.includes(name)) throw new UsageError(`flag provided but not defined: -${name}`);
    if (bools.includes(name)) {
      // As Go's boolean flags: -name alone is true; a value only after "=".
      value ??= "true";
      if (!["true", "false", "1", "0", "t", "f", "TRUE", "FALSE", "True", "False"].includes(value)) throw new UsageError(`invalid boolean value ${JSON.stringify(value)} for -${name}`);
      flags.set(name, ["true", "1", "t", "TRUE", "True"].includes(value) ? "true" : "false");
      continue;
    }
    if (value === undefined) {
      if (i + 1 >= args.length) throw new UsageError(`flag needs an argument: -${name}`);
      value = args[++i]!;
    }
    flags.set(name, value);
  }
  return { flags, rest: args.slice(i) };
}

const UNITS: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** A Go duration ("60s", "1m30s", "500ms") in milliseconds. */
function parseDuration(s: string): number {
  if (s === "0") return 0;
  const re = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/gy;
  let total = 0;
  let end = 0;
  for (let m = re.exec(s); m; m = re.exec(s)) {
    total += Number(m[1]) * UNITS[m[2]!]!;
    end = re.lastIndex;
  }
  if (s === "" || end !== s.length) throw new UsageError(`invalid duration ${JSON.stringify(s)}`);
  return total;
}

function wholeNumber(name: string, s: string, min: number): number {
  if (!/^\d{1,9}$/.test(s) || Number(s) < min) throw new UsageError(`-${name}: want a whole number of at least ${min}, got ${JSON.stringify(s)}`);
  return Number(s);
}

const COMMON = ["url", "token", "token-file", "codec", "store"];
const DEFAULT_URL = "http://127.0.0.1:8080";

async function clientFrom(flags: Flags, env: NodeJS.ProcessEnv): Promise<RelayClient> {
  const codec = flags.get("codec") ?? "json";
  if (codec === "msgpack") throw new UsageError("-codec msgpack: this command line speaks JSON only");
  if (codec !== "json") throw new UsageError(`-codec ${codec}: want json`);
  if (flags.has("store")) return storeClient(flags, env);
  let token = flags.get("token") ?? "";
  if (!token && flags.has("token-file")) {
    try {
      token = (await readFile(flags.get("token-file")!, "utf8")).trim();
    } catch (e) {
      throw new UsageError(`-token-file: ${(e as Error).message}`);
    }
  }
  if (!token) token = (env.FN_TOKEN ?? "").trim();
  if (!token) throw new UsageError("no token: give -token, -token-file or FN_TOKEN");
  const url = flags.get("url") || env.FN_RELAY_URL || DEFAULT_URL;
  try {
    return new RelayClient({ url, token, log: (line) => process.stderr.write(`relay-client: ${line}\n`) });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
}

/** A client on the credentials of the -store file, renewed into it; the file's URL unless -url or FN_RELAY_URL names one. */
async function storeClient(flags: Flags, env: NodeJS.ProcessEnv): Promise<RelayClient> {
  if (flags.has("token") || flags.has("token-file")) throw new UsageError("give -store or a token, not both");
  const store = new FileCredentialStore(flags.get("store")!);
  let creds;
  try {
    creds = await store.load();
  } catch (e) {
    throw new UsageError(`-store: ${(e as Error).message}`);
  }
  if (!creds) throw new UsageError(`-store: ${flags.get("store")} does not exist; pair first`);
  const url = flags.get("url") || env.FN_RELAY_URL || creds.url || DEFAULT_URL;
  const credentials = await RenewingCredentials.open(url, store);
  return new RelayClient({ url, credentials, log: (line) => process.stderr.write(`relay-client: ${line}\n`) });
}

async function pairCmd(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const { flags, rest } = parseFlags(args, ["url", "code", "store", "identity"]);
  if (rest.length > 0) throw new UsageError(`pair takes no arguments, got ${JSON.stringify(rest[0])}`);
  const code = (flags.get("code") ?? "").trim();
  const file = flags.get("store") ?? "";
  if (!code || !file) throw new UsageError("pair needs -code and -store");
  if (flags.has("identity") && !flags.get("identity")) throw new UsageError("-identity names no file");
  const url = flags.get("url") || env.FN_RELAY_URL || DEFAULT_URL;
  const identity = flags.has("identity") ? (await loadIdentity(flags.get("identity")!)).identity : undefined;
  const c = await pair(url, code, { store: new FileCredentialStore(file), ...(identity && { identityKey: identity.publicKey }) }).catch((e: unknown) => {
    // The code alone does not name the device: the admin knows it.
    throw e instanceof RelayError && e.status === 401 ? new Error(`${e.message} (relay invite -device NAME)`, { cause: e }) : e;
  });
  await writeLine(`paired as device ${JSON.stringify(c.device)} of household ${JSON.stringify(c.household)} (scope ${c.scope}); credentials in ${file}, renewal secret valid until ${c.renewal_expires_at}`);
  // The inviting admin sees the key the relay received (relay invite
  // -list): the same digits mean no one swapped it on the way.
  if (identity) await writeLine(`fingerprint: ${await fingerprint(identity.publicKey)}`);
  return 0;
}

async function readStdin(): Promise<Uint8Array> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return new Uint8Array(Buffer.concat(chunks));
}

/** Writes one line and resolves once it was handed to the OS. */
function writeLine(line: string): Promise<void> {
  return new Promise((resolve, reject) => process.stdout.write(line + "\n", (err) => (err ? reject(err) : resolve())));
}

async function send(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const { flags, rest } = parseFlags(args, [...COMMON, ...SEAL_FLAGS, "to", "id", "file", "timeout"], ["seal"]);
  if (rest.length > 1) throw new UsageError(`send takes one payload argument, got ${rest.length}`);
  const to = (flags.get("to") ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (to.length === 0) throw new UsageError("send needs -to dev1,dev2");
  const timeoutMs = parseDuration(flags.get("timeout") ?? "60s");
  const id = flags.get("id") ?? newId();
  if (id === "") throw new UsageError("-id is empty");
  const client = await clientFrom(flags, env);
  let payload: Uint8Array;
  if (flags.has("file")) {
    if (rest.length > 0) throw new UsageError("give the payload as an argument or -file, not both");
    try {
      payload = new Uint8Array(await readFile(flags.get("file")!));
    } catch (e) {
      throw new UsageError(`-file: ${(e as Error).message}`);
    }
  } else if (rest.length === 1 && rest[0] !== "-") {
    payload = new TextEncoder().encode(rest[0]!);
  } else {
    payload = await readStdin();
  }
  const signal = AbortSignal.timeout(Math.max(timeoutMs, 1));
  if (flags.get("seal") === "true") payload = await (await sealedFrom(client, flags, signal)).seal(id, to, payload);
  const res = await client.send(to, payload, { id, signal }).catch(nextStep(flags, env));
  await writeLine(JSON.stringify({ id: res.id, deliveries: res.deliveries.map((d) => ({ device: d.device, seq: d.seq })) }));
  return 0;
}

async function listen(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const { flags, rest } = parseFlags(args, [...COMMON, ...SEAL_FLAGS, "drop", "cursor-file", "wait", "count"], ["open"]);
  if (rest.length > 0) throw new UsageError(`listen takes no arguments, got ${JSON.stringify(rest[0])}`);
  const wait = wholeNumber("wait", flags.get("wait") ?? "20", 1);
  const count = wholeNumber("count", flags.get("count") ?? "0", 0);
  if (flags.has("drop") && flags.get("open") !== "true") throw new UsageError("-drop goes with -open");
  const client = await clientFrom(flags, env);
  const cursorStore = flags.has("cursor-file") ? new FileCursorStore(flags.get("cursor-file")!) : new MemoryCursorStore();
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  let handled = 0;
  // Stopping in a handler still lets listen persist that envelope's
  // cursor: it checks the signal only before the next one.
  const counted = () => {
    if (count > 0 && ++handled >= count) stop.abort();
  };
  const print = (e: Envelope, payload: Uint8Array) => writeLine(JSON.stringify({ seq: e.seq, id: e.id, from: e.from, sent_at: e.sent_at, payload: encodeBase64(payload) }));
  if (flags.get("open") === "true") {
    const sealed = await sealedFrom(client, flags, stop.signal);
    const held = new FileHeldStore(`${flags.get("identity")}.held`);
    for (const d of devices(flags.get("drop"))) {
      process.stderr.write(`relay-client: dropped ${await sealed.dropHeld(d, { held })} held-back envelopes from ${d}\n`);
    }
    await sealed.listen(
      async (e) => {
        await print(e, e.plaintext);
        counted();
      },
      {
        cursorStore,
        held,
        signal: stop.signal,
        wait,
        // An envelope that does not open is a line too: payload null, and
        // the code of the check that refused it.
        onRefused: async (e, err) => {
          process.stderr.write(`relay-client: envelope ${e.seq} from ${e.from} does not open: ${err.message}\n`);
          if (err.code === "key_changed") {
            process.stderr.write(
              `relay-client: envelope ${e.seq} from ${e.from} is held back in ${held.path}: it opens once -trust ${e.from} accepts the new key (compare fingerprints first), or -drop ${e.from} discards it\n`,
            );
          }
          await writeLine(JSON.stringify({ seq: e.seq, id: e.id, from: e.from, sent_at: e.sent_at, payload: null, error: err.code }));
          counted();
        },
      },
    ).catch(nextStep(flags, env));
  } else {
    await client
      .listen(
        async (e: Envelope) => {
          await print(e, e.payload);
          counted();
        },
        { cursorStore, signal: stop.signal, wait },
      )
      .catch(nextStep(flags, env));
  }
  await ackSaved(client, cursorStore);
  return 0;
}

/**
 * A catch handler that adds to a refusal of the device's credentials for
 * good the commands that help, as the relay binary's send and listen do:
 * with -store, the invitation and pairing that replace them, with the
 * device's names from the file; with a token, token check, which asks the
 * relay why.
 */
function nextStep(flags: Flags, env: NodeJS.ProcessEnv) {
  return async (e: unknown): Promise<never> => {
    if (!(e instanceof RelayError && e.status === 401)) throw e;
    if (!flags.has("store")) {
      const url = flags.get("url") || env.FN_RELAY_URL || DEFAULT_URL;
      throw new Error(`${e.message}; relay token check -url ${url} TOKEN says why`, { cause: e });
    }
    const file = flags.get("store")!;
    const c = await new FileCredentialStore(file).load().catch(() => undefined);
    if (!c) throw e;
    const url = flags.get("url") || env.FN_RELAY_URL || c.url || DEFAULT_URL; // as storeClient chose it
    const scope = c.scope === "admin" ? " -scope admin" : "";
    // The invitation relay remove names. The refusal does not say why: a
    // device refused for reuse of its secret still exists, and only
    // -replace invites it.
    throw new Error(`${e.message} (relay invite -household ${c.household} -device ${c.device}${scope}, then relay-client pair -url ${url} -code CODE -store ${file}; if relay devices still lists ${c.device}, invite with -replace)`, { cause: e });
  };
}

/**
 * Acknowledges the saved position. listen acknowledges only with its next
 * poll, which a stopped listen never makes: without this the next listener
 * is handed the last envelopes again. A failure is said, not fatal.
 */
async function ackSaved(client: RelayClient, cursorStore: FileCursorStore | MemoryCursorStore): Promise<void> {
  const pos = await cursorStore.load();
  if (pos.cursor === 0) return;
  try {
    await client.ack(pos.cursor, { epoch: pos.epoch, signal: AbortSignal.timeout(10_000) });
  } catch (e) {
    process.stderr.write(`relay-client: acknowledging seq ${pos.cursor}: ${(e as Error).message}; the next listen may print it again\n`);
  }
}

/** A comma-separated list of devices. */
function devices(list: string | undefined): string[] {
  return (list ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "");
}

const SEAL_FLAGS = ["identity", "keyring", "trust"];

/**
 * The device's sealing side for -seal and -open, as the relay binary's:
 * its identity from -identity (made if the file does not exist), its pins
 * from -keyring, registered with the relay, the directory read, and the
 * devices -trust names trusted. Changes are told on stderr.
 */
async function sealedFrom(client: RelayClient, flags: Flags, signal: AbortSignal): Promise<SealedClient> {
  const identityFile = flags.get("identity");
  if (!identityFile) throw new UsageError("-identity names no file");
  const { identity, created } = await loadIdentity(identityFile);
  const keyring = await Keyring.load(new FilePinStore(flags.get("keyring") || `${identityFile}.pins`));
  const sealed = await SealedClient.register(client, identity, keyring, { signal });
  if (created) process.stderr.write(`relay-client: created the identity ${identityFile}; ${sealed.device}'s fingerprint: ${await fingerprint(identity.publicKey)}\n`);
  for (const d of devices(flags.get("trust"))) {
    let key: Uint8Array;
    try {
      key = await sealed.trustListed(d, { signal });
    } catch (e) {
      throw new Error(`-trust ${d}: ${(e as Error).message}`, { cause: e });
    }
    process.stderr.write(`relay-client: trusting ${d}'s key, fingerprint ${await fingerprint(key)}\n`);
  }
  // Every change not yet trusted, also those an earlier run saw.
  for (const c of keyring.changes()) {
    process.stderr.write(
      `relay-client: ${c.device}'s key changed in the directory: pinned ${await fingerprint(c.pinned)}, listed ${await fingerprint(c.seen)}; ` +
        `nothing is sealed to it or opened from it until -trust ${c.device}\n`,
    );
  }
  return sealed;
}

async function main(argv: string[]): Promise<number> {
  const [cmd, ...args] = argv;
  try {
    switch (cmd) {
      case "send":
        return await send(args, process.env);
      case "listen":
        return await listen(args, process.env);
      case "pair":
        return await pairCmd(args, process.env);
      case "-h":
      case "-help":
      case "--help":
      case "help":
        process.stderr.write(USAGE + "\n");
        return 0;
    }
    throw new UsageError(cmd === undefined ? "no command" : `unknown command ${JSON.stringify(cmd)}`);
  } catch (e) {
    if (e instanceof UsageError) {
      if (e.message) process.stderr.write(`relay-client: ${e.message}\n`);
      process.stderr.write(USAGE + "\n");
      return e.message ? 2 : 0;
    }
    process.stderr.write(`relay-client: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  }
}

process.exit(await main(process.argv.slice(2)));
