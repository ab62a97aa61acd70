import assert from "node:assert/strict";
import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { FileCursorStore } from "../node.js";

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
// (clients/testdata/browser/index.html) maps them, none importing Node.
test("the browser entry point imports nothing of Node", async () => {
  const dist = resolve(dirname(fileURLToPath(import.meta.url)), "..");
  const html = await readFile(join(dist, "..", "..", "testdata", "browser", "index.html"), "utf8");
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
