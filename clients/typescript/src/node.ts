// Node-only parts of the client: a cursor kept in a file.
import { randomBytes } from "node:crypto";
import { open, readFile, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

import type { CursorStore } from "./cursor.js";

/**
 * A cursor kept in a file as its decimal digits and a newline. save writes
 * a temporary file beside it, syncs it, renames it over the old one and
 * syncs the directory, so a crash leaves the old cursor or the new one,
 * never a torn file.
 */
export class FileCursorStore implements CursorStore {
  constructor(readonly path: string) {}

  /** The file's cursor; a missing file is 0. */
  async load(): Promise<number> {
    let text: string;
    try {
      text = await readFile(this.path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return 0;
      throw new Error(`cursor file ${this.path}: ${(e as Error).message}`, { cause: e });
    }
    const t = text.trim();
    if (!/^\d{1,19}$/.test(t) || !Number.isSafeInteger(Number(t))) {
      throw new Error(`cursor file ${this.path} does not hold a cursor: ${JSON.stringify(text.slice(0, 40))}`);
    }
    return Number(t);
  }

  async save(cursor: number): Promise<void> {
    if (!Number.isSafeInteger(cursor) || cursor < 0) throw new Error(`cursor ${cursor} is not a whole number`);
    const dir = dirname(this.path);
    const tmp = join(dir, `.${basename(this.path)}.${randomBytes(6).toString("hex")}.tmp`);
    const f = await open(tmp, "wx", 0o600);
    try {
      await f.writeFile(`${cursor}\n`);
      await f.sync();
    } catch (e) {
      await f.close();
      await unlink(tmp).catch(() => {});
      throw e;
    }
    await f.close();
    try {
      await rename(tmp, this.path);
    } catch (e) {
      await unlink(tmp).catch(() => {});
      throw e;
    }
    // The rename is durable once the directory is.
    const d = await open(dir, "r");
    try {
      await d.sync();
    } finally {
      await d.close();
    }
  }
}
