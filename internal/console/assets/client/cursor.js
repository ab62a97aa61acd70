/** The wire's rule for an epoch: 1 to 32 characters of [A-Za-z0-9_-]. */
export function validEpoch(epoch) {
    return /^[A-Za-z0-9_-]{1,32}$/.test(epoch);
}
/**
 * A position in memory: for tests, and for apps that keep it elsewhere (in
 * the browser, IndexedDB or localStorage behind the same two methods).
 */
export class MemoryCursorStore {
    cursor;
    epoch;
    constructor(cursor = 0, epoch = undefined) {
        this.cursor = cursor;
        this.epoch = epoch;
    }
    async load() {
        return { cursor: this.cursor, epoch: this.epoch };
    }
    async save(position) {
        this.cursor = position.cursor;
        this.epoch = position.epoch;
    }
}
