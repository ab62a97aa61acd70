/**
 * A cursor in memory: for tests, and for apps that keep it elsewhere (in
 * the browser, IndexedDB or localStorage behind the same two methods).
 */
export class MemoryCursorStore {
    cursor;
    constructor(cursor = 0) {
        this.cursor = cursor;
    }
    async load() {
        return this.cursor;
    }
    async save(cursor) {
        this.cursor = cursor;
    }
}
