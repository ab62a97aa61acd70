/**
 * Keeps a device's cursor: the highest seq it has processed. listen saves
 * it after each envelope's handler returned and before the next is
 * handled, so save must be durable when its promise resolves.
 */
export interface CursorStore {
  /** The saved cursor; 0 when none was ever saved. */
  load(): Promise<number>;
  save(cursor: number): Promise<void>;
}

/**
 * A cursor in memory: for tests, and for apps that keep it elsewhere (in
 * the browser, IndexedDB or localStorage behind the same two methods).
 */
export class MemoryCursorStore implements CursorStore {
  constructor(public cursor = 0) {}
  async load(): Promise<number> {
    return this.cursor;
  }
  async save(cursor: number): Promise<void> {
    this.cursor = cursor;
  }
}
