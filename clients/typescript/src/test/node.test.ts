import assert from "node:assert/strict";
import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { FileCursorStore } from "../node.js";

test("FileCursorStore keeps the cursor as digits and a newline, replaced whole", async () => {
  const dir = await mkdtemp(join(tmpdir(), "cursor-"));
  try {
    const path = join(dir, "phone.cursor");
    const store = new FileCursorStore(path);
    assert.equal(await store.load(), 0, "a missing file is cursor 0");
    await store.save(7);
    assert.equal(await readFile(path, "utf8"), "7\n");
    await store.save(12345);
    assert.equal(await readFile(path, "utf8"), "12345\n");
    assert.equal(await new FileCursorStore(path).load(), 12345);
    assert.deepEqual(await readdir(dir), ["phone.cursor"], "a temporary file was left behind");

    await writeFile(path, "12x\n");
    await assert.rejects(store.load(), /does not hold a cursor/);
    await assert.rejects(store.save(-1), /not a whole number/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// What a browser loads must not import Node's modules: the entry point's
// import graph holds only relative modules of this package, and not node.js.
test("the browser entry point imports nothing of Node", async () => {
  const dist = resolve(dirname(fileURLToPath(import.meta.url)), "..");
  const seen = new Set<string>();
  const walk = async (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const src = await readFile(file, "utf8");
    for (const m of src.matchAll(/(?:^|[\s;])(?:import|export)\s*(?:[^'"]*?\sfrom\s*)?["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g)) {
      const spec = m[1] ?? m[2]!;
      assert.ok(spec.startsWith("./"), `${file} imports ${spec}`);
      await walk(resolve(dirname(file), spec));
    }
  };
  await walk(join(dist, "index.js"));
  assert.ok(seen.size > 3, `walked only ${[...seen].join(", ")}`);
  assert.ok(![...seen].some((f) => f.endsWith("/node.js")), "index.js reaches node.js");
  // The walker sees the Node module's own imports: it would notice them.
  const nodeSrc = await readFile(join(dist, "node.js"), "utf8");
  assert.match(nodeSrc, /from "node:fs\/promises"/);
});
