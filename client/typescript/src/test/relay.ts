// A real relay for the tests: the binary built from this checkout (or the
// one FN_TEST_RELAY_BIN names), serving SQLite in a temporary directory on
// a free loopback port, trusting an issuer key made by `relay keygen`.
import { execFile, spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { rmSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import type { Server, Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The repository's root: dist/test -> dist -> typescript -> clients -> root. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
/** The compiled command line. */
export const cliPath = resolve(dirname(fileURLToPath(import.meta.url)), "../cli.js");

// What this process started or made, ended and removed when it exits,
// also when the test runner stops it (a timeout sends SIGTERM), so that no
// relay outlives the tests.
const children = new Set<ChildProcess>();
const paths = new Set<string>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
  for (const p of paths) rmSync(p, { recursive: true, force: true });
});
for (const sig of ["SIGTERM", "SIGINT"] as const) process.once(sig, () => process.exit(1));

/** Kills child when the process exits, unless it ended before. */
export function track(child: ChildProcess): void {
  children.add(child);
  child.once("exit", () => children.delete(child));
}

/** Removes path when the process exits, unless removed before. */
export function removeAtExit(path: string): void {
  paths.add(path);
}

let built: Promise<string> | undefined;

/** The relay binary: FN_TEST_RELAY_BIN, or `go build` of the checkout, once per process. */
export function relayBinary(): Promise<string> {
  built ??= (async () => {
    if (process.env.FN_TEST_RELAY_BIN) return process.env.FN_TEST_RELAY_BIN;
    const dir = await mkdtemp(join(tmpdir(), "relay-bin-"));
    removeAtExit(dir);
    const bin = join(dir, "relay");
    try {
      await run("go", ["build", "-o", bin, "."], { cwd: repoRoot, timeout: 600_000 });
    } catch (e) {
      throw new Error(`building the relay with go build in ${repoRoot} (or set FN_TEST_RELAY_BIN): ${(e as Error).message}`);
    }
    return bin;
  })();
  return built;
}

export interface Relay {
  url: string;
  /** A device token of household hh, minted by `relay token`. */
  token(hh: string, device: string, scope?: "device" | "admin"): Promise<string>;
  stop(): Promise<void>;
}

/**
 * Starts `relay serve`; env adds or overrides FN_* settings. With pairing,
 * the relay holds the issuer's private key (the self-hosted shape), so its
 * pairing endpoints are on; tokens are minted with the same key either way.
 */
export async function startRelay(env: Record<string, string> = {}, opts: { pairing?: boolean } = {}): Promise<Relay> {
  const bin = await relayBinary();
  const dir = await mkdtemp(join(tmpdir(), "relay-test-"));
  removeAtExit(dir);
  const keys = (await run(bin, ["keygen"])).stdout;
  const seed = /^private: (\S+)$/m.exec(keys)?.[1];
  const pub = /^public: +(\S+)$/m.exec(keys)?.[1];
  if (!seed || !pub) throw new Error(`relay keygen printed no key pair: ${keys}`);
  const issuer: Record<string, string> = { FN_ISSUER_KEYS: pub };
  if (opts.pairing) {
    const file = join(dir, "issuer.key");
    await writeFile(file, seed + "\n", { mode: 0o600 });
    Object.assign(issuer, { FN_ISSUER_KEYS: "", FN_ISSUER_KEY_FILE: file });
  }
  // Only this relay's settings, never the caller's FN_*.
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("FN_")));
  const child = spawn(bin, ["serve"], {
    env: {
      ...base,
      FN_LISTEN: "127.0.0.1:0",
      FN_DATABASE_URL: `sqlite:${join(dir, "relay.db")}`,
      ...issuer,
      FN_SQLITE_SYNCHRONOUS: "NORMAL",
      FN_SHUTDOWN_GRACE: "2s",
      ...env,
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  track(child);
  const url = await serving(child);
  return {
    url,
    async token(hh, device, scope = "device") {
      // The private key through the environment: never on a command line.
      const env = { ...process.env, FN_ISSUER_PRIVATE_KEY: seed, FN_ISSUER_KEY_FILE: "" };
      return (await run(bin, ["token", "-household", hh, "-device", device, "-scope", scope, "-ttl", "1h"], { env })).stdout.trim();
    },
    async stop() {
      await stopProcess(child);
      await rm(dir, { recursive: true, force: true });
      paths.delete(dir);
    },
  };
}

/** Waits for the relay's "serving" log line and returns its address. */
function serving(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    let log = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`the relay did not start within 30 s:\n${log}`));
    }, 30_000);
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (chunk: string) => {
      if (log.length < 64 << 10) log += chunk;
      const m = /msg=serving addr=(http:\/\/\S+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the relay exited (${code}) before serving:\n${log}`));
    });
  });
}

/** SIGTERM, then SIGKILL if it has not exited within 15 s. */
export function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

/**
 * A TCP proxy in front of the relay that can drop connections: refuse
 * closes the next n connections at once; loseAnswer lets the next request
 * through and closes its connection when the answer starts, so the relay
 * processed it but the client never hears; cutAfter closes a connection
 * in the middle of an answer.
 */
export class FaultyProxy {
  url = "";
  private server: Server;
  private refuse = 0;
  private lose = 0;
  private cuts = 0;
  private cutOn = "";
  private readonly sockets = new Set<Socket>();
  connections = 0;

  constructor(private readonly target: URL) {
    this.server = createServer((client) => this.accept(client));
  }

  static async start(target: string): Promise<FaultyProxy> {
    const p = new FaultyProxy(new URL(target));
    await new Promise<void>((resolve) => p.server.listen(0, "127.0.0.1", resolve));
    const addr = p.server.address();
    if (addr === null || typeof addr === "string") throw new Error("proxy: no address");
    p.url = `http://127.0.0.1:${addr.port}`;
    return p;
  }

  refuseNext(n: number): void {
    this.refuse += n;
  }

  loseNextAnswer(): void {
    this.lose++;
  }

  /** Cuts the next n connections right after forwarding a chunk that holds text. */
  cutAfter(text: string, n: number): void {
    this.cutOn = text;
    this.cuts += n;
  }

  private accept(client: Socket): void {
    this.connections++;
    this.sockets.add(client);
    client.on("close", () => this.sockets.delete(client));
    client.on("error", () => {});
    if (this.refuse > 0) {
      this.refuse--;
      client.destroy();
      return;
    }
    const lose = this.lose > 0;
    if (lose) this.lose--;
    const up = new (client.constructor as typeof Socket)();
    this.sockets.add(up);
    up.on("close", () => this.sockets.delete(up));
    up.on("error", () => client.destroy());
    up.connect(Number(this.target.port), this.target.hostname);
    client.pipe(up);
    up.on("data", (chunk: Buffer) => {
      if (lose) {
        client.destroy();
        up.destroy();
        return;
      }
      client.write(chunk);
      if (this.cuts > 0 && chunk.includes(this.cutOn)) {
        this.cuts--;
        client.destroy();
        up.destroy();
      }
    });
    up.on("end", () => client.end());
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** A household name of its own for each test. */
export function household(): string {
  return `hh-${Math.random().toString(36).slice(2, 10)}`;
}

/** Polls cond until it holds or ms pass. */
export async function eventually(what: string, cond: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
