// The sealed-envelope example of the README and of docs/E2E.md is
// sealed-example.ts, line for line, and it runs.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { sealedExample } from "./sealed-example.js";
import { household, repoRoot, startRelay } from "./relay.js";
import type { Relay } from "./relay.js";

const tsRoot = join(repoRoot, "client", "typescript");

/** The example's import line and the lines between its markers, de-indented, as the README must show them. */
export function exampleLines(src: string): string[] {
  const lines = src.split("\n");
  const imp = lines.find((l) => l.startsWith("import ") && l.endsWith(' from "../index.js";'));
  assert.ok(imp, "the example imports the client");
  const begin = lines.findIndex((l) => l.trim() === "// README:begin");
  const end = lines.findIndex((l) => l.trim() === "// README:end");
  assert.ok(begin >= 0 && end > begin, "the example has its markers");
  const body = lines.slice(begin + 1, end);
  const indent = Math.min(...body.filter((l) => l.trim() !== "").map((l) => l.length - l.trimStart().length));
  return [imp.replace('"../index.js"', '"@flamenet/relay-client"'), "", ...body.map((l) => l.slice(indent))];
}

/** The README's code block that follows the line marking it. */
export function readmeBlock(readme: string, marker: string): string[] {
  const lines = readme.split("\n");
  const at = lines.findIndex((l) => l.includes(marker));
  assert.ok(at >= 0, `the README has ${marker}`);
  const open = lines.findIndex((l, i) => i > at && l.startsWith("```"));
  const close = lines.findIndex((l, i) => i > open && l === "```");
  assert.ok(open > at && close > open, "a code block follows the marker");
  return lines.slice(open + 1, close);
}

let relay: Relay;
before(async () => {
  relay = await startRelay();
});
after(async () => {
  await relay?.stop();
});

test("the README shows the sealed example as it is in src/test/sealed-example.ts", async () => {
  const readme = await readFile(join(tsRoot, "README.md"), "utf8");
  const src = await readFile(join(tsRoot, "src", "test", "sealed-example.ts"), "utf8");
  assert.deepEqual(readmeBlock(readme, "<!-- sealed example: src/test/sealed-example.ts -->"), exampleLines(src));
});

test("docs/E2E.md shows the same sealed example", async () => {
  const doc = await readFile(join(repoRoot, "docs", "E2E.md"), "utf8");
  const src = await readFile(join(tsRoot, "src", "test", "sealed-example.ts"), "utf8");
  assert.deepEqual(readmeBlock(doc, "<!-- ts example: client/typescript/src/test/sealed-example.ts -->"), exampleLines(src));
});

test("the sealed example runs: phone opens what laptop sealed", { timeout: 60_000 }, async () => {
  const hh = household();
  const got = await sealedExample(relay.url, await relay.token(hh, "phone"), await relay.token(hh, "laptop"));
  assert.equal(got, "only phone can read this");
});
