import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { FileCursorStore } from "../node.js";
import { repoRoot } from "./relay.js";

test("FileCursorStore keeps the cursor as digits, a space and the epoch, and a newline, replaced whole", async () => {
  const dir = await mkdtemp(join(tmpdir(), "cursor-"));
  try {
    const path = join(dir, "phone.cursor");
    const store = new FileCursorStore(path);
    assert.deepEqual(await store.load(), { cursor: 0 }, "a missing file is cursor 0");
    await store.save({ cursor: 7 });
    assert.equal(await readFile(path, "utf8"), "7\n");
    await store.save({ cursor: 12345, epoch: "AAAAAAAAAAAAAAAA" });
    assert.equal(await readFile(path, "utf8"), "12345 AAAAAAAAAAAAAAAA\n");
    assert.deepEqual(await new FileCursorStore(path).load(), { cursor: 12345, epoch: "AAAAAAAAAAAAAAAA" });
    assert.deepEqual(await readdir(dir), ["phone.cursor"], "a temporary file was left behind");

    // A file written before epochs, or by the Go client.
    await writeFile(path, "42\n");
    assert.deepEqual(await store.load(), { cursor: 42 });
    await writeFile(path, "43 x_-9\n");
    assert.deepEqual(await store.load(), { cursor: 43, epoch: "x_-9" });

    for (const bad of ["12x\n", "12 a/b\n", `12 ${"a".repeat(33)}\n`, "12  AAAA\n"]) {
      await writeFile(path, bad);
      await assert.rejects(store.load(), /does not hold a cursor/, bad);
    }
    await assert.rejects(store.save({ cursor: -1 }), /not a whole number/);
    await assert.rejects(store.save({ cursor: 1, epoch: "a b" }), /not 1 to 32 characters/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// What a browser loads must not import Node's modules: the entry point's
// import graph holds relative modules of this package, not node.js, and
// the pinned dependencies as the browser pages' import map
// (test/clients/testdata/browser/index.html) maps them, none importing Node.
test("the browser entry point imports nothing of Node", async () => {
  const dist = resolve(dirname(fileURLToPath(import.meta.url)), "..");
  const html = await readFile(join(repoRoot, "test", "clients", "testdata", "browser", "index.html"), "utf8");
  const imports = (JSON.parse(/<script type="importmap">([\s\S]*?)<\/script>/.exec(html)![1]!) as { imports: Record<string, string> }).imports;
  const mapped = (spec: string): string | undefined => {
    const key = spec in imports ? spec : Object.keys(imports).find((k) => k.endsWith("/") && spec.startsWith(k));
    if (key === undefined) return undefined;
    const url = imports[key]! + spec.slice(key.length);
    assert.ok(url.startsWith("/node_modules/"), url);
    return join(dist, "..", url);
  };
  const seen = new Set<string>();
  const walk = async (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    // Without comments: the dependencies' documentation shows imports.
    const src = (await readFile(file, "utf8")).replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
    for (const m of src.matchAll(/(?:^|[\s;])(?:import|export)\s*(?:[^'"]*?\sfrom\s*)?["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g)) {
      const spec = m[1] ?? m[2]!;
      if (spec.startsWith("./") || spec.startsWith("../")) {
        await walk(resolve(dirname(file), spec));
        continue;
      }
      // @hpke/common imports Node's crypto, dynamically, only where
      // globalThis.crypto is missing (Node before 19), never in a browser.
      if (spec === "crypto" && file.includes("/node_modules/@hpke/common/esm/") && m[2] === "crypto" && src.includes("globalThis.crypto")) continue;
      const target = mapped(spec);
      assert.ok(target !== undefined, `${file} imports ${spec}, which the import map does not map`);
      await walk(target);
    }
  };
  await walk(join(dist, "index.js"));
  assert.ok(seen.size > 3, `walked only ${[...seen].join(", ")}`);
  assert.ok([...seen].some((f) => f.includes("/node_modules/@hpke/core/")), "the walk reaches the dependencies");
  assert.ok(![...seen].some((f) => f.endsWith("/node.js")), "index.js reaches node.js");
  // The walker sees the Node module's own imports: it would notice them.
  const nodeSrc = await readFile(join(dist, "node.js"), "utf8");
  assert.match(nodeSrc, /from "node:fs\/promises"/);
});

// Seen red while package.json said Node >=20 and the README did not say
// what require() needs, nor that fingerprint() is asynchronous.
test("a CommonJS project requires the ES module where package.json's engines say, and the README says so", async () => {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
  const pkg = JSON.parse(await readFile(join(root, "package.json"), "utf8")) as { engines: { node: string }; type: string };
  assert.equal(pkg.type, "module");
  // require(esm) is on by default from Node 20.19 and 22.12.
  assert.equal(pkg.engines.node, "^20.19.0 || >=22.12.0");
  const readme = (await readFile(join(root, "README.md"), "utf8")).replace(/\s+/g, " ");
  assert.ok(readme.includes(`"node": "${pkg.engines.node}"`), "the README names the engines range");
  assert.ok(readme.includes("ERR_REQUIRE_ESM"), "the README says what an older Node answers");
  assert.match(readme, /`fingerprint\(key\)`[^.]*returns a Promise/, "the README says fingerprint is asynchronous");

  const dir = await mkdtemp(join(tmpdir(), "cjs-"));
  try {
    await mkdir(join(dir, "node_modules", "@flamenet"), { recursive: true });
    await symlink(root, join(dir, "node_modules", "@flamenet", "relay-client"));
    await writeFile(join(dir, "package.json"), JSON.stringify({ name: "cjs-app", version: "1.0.0", type: "commonjs" }));
    await writeFile(
      join(dir, "app.js"),
      `const { RelayClient, fingerprint } = require("@flamenet/relay-client");
const { FileCursorStore } = require("@flamenet/relay-client/node");
const f = fingerprint(new Uint8Array(32).fill(7));
f.then((s) => console.log(typeof RelayClient, typeof FileCursorStore, f instanceof Promise, s.length > 0), (e) => { console.error(e); process.exit(1); });
`,
    );
    const node = (...args: string[]) =>
      new Promise<{ code: number | null; out: string; err: string }>((done) => {
        execFile(process.execPath, [...args, "app.js"], { cwd: dir }, (e, out, err) => done({ code: e ? (e.code as number) ?? 1 : 0, out, err }));
      });
    const ok = await node();
    assert.equal(ok.code, 0, ok.err);
    assert.equal(ok.out.trim(), "function function true true");
    const old = await node("--no-experimental-require-module");
    assert.notEqual(old.code, 0);
    assert.match(old.err, /ERR_REQUIRE_ESM/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
