// Node-only: a paired device's credentials kept in a file.
import { randomBytes } from "node:crypto";
import { open, readFile, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

import type { CredentialStore, Credentials } from "./credentials.js";

/**
 * Credentials in a JSON file readable by its owner only (0600), in the
 * Go client's FileStore format: save writes a temporary file beside it,
 * syncs it, renames it over the old one and syncs the directory, so a
 * crash leaves the old set or the new one, never a torn file.
 */
export class FileCredentialStore implements CredentialStore {
  constructor(readonly path: string) {}

  /** The file's credentials; undefined when there is no file. */
  async load(): Promise<Credentials | undefined> {
    let text: string;
    try {
      text = await readFile(this.path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw new Error(`credentials file ${this.path}: ${(e as Error).message}`, { cause: e });
    }
    try {
      return JSON.parse(text) as Credentials;
    } catch (e) {
      throw new Error(`credentials file ${this.path}: ${(e as Error).message}`, { cause: e });
    }
  }

  async save(c: Credentials): Promise<void> {
    const dir = dirname(this.path);
    const tmp = join(dir, `.${basename(this.path)}.${randomBytes(6).toString("hex")}.tmp`);
    const f = await open(tmp, "wx", 0o600);
    try {
      await f.writeFile(JSON.stringify(c, null, 2) + "\n");
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
    const d = await open(dir, "r");
    try {
      await d.sync();
    } finally {
      await d.close();
    }
  }
}
