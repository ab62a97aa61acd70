/**
 * Where a device stands: its cursor, the highest seq it has processed, and
 * the store epoch the cursor was taken in. The relay answers a poll or ack
 * whose epoch is not its store's current one with 409 cursor_ahead: the
 * store's history went back (a failover that lost commits, a restored
 * backup), and the cursor may name envelopes that are not the ones
 * processed.
 */
export interface Position {
  cursor: number;
  /** Undefined until a relay named one (or with a relay that has none): then nothing is checked. */
  epoch?: string | undefined;
}

/**
 * Keeps a device's position. listen saves it after each envelope's handler
 * returned and before the next is handled, so save must be durable when
 * its promise resolves, and must keep the cursor and the epoch together: a
 * cursor with another epoch than its own defeats the check.
 */
export interface CursorStore {
  /** The saved position; cursor 0 and no epoch when none was ever saved. */
  load(): Promise<Position>;
  save(position: Position): Promise<void>;
}

/** The wire's rule for an epoch: 1 to 32 characters of [A-Za-z0-9_-]. */
export function validEpoch(epoch: string): boolean {
  return /^[A-Za-z0-9_-]{1,32}$/.test(epoch);
}

/**
 * A position in memory: for tests, and for apps that keep it elsewhere (in
 * the browser, IndexedDB or localStorage behind the same two methods).
 */
export class MemoryCursorStore implements CursorStore {
  constructor(
    public cursor = 0,
    public epoch: string | undefined = undefined,
  ) {}
  async load(): Promise<Position> {
    return { cursor: this.cursor, epoch: this.epoch };
  }
  async save(position: Position): Promise<void> {
    this.cursor = position.cursor;
    this.epoch = position.epoch;
  }
}
