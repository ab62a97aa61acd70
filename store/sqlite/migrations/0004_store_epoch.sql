-- The store's epoch (store.History): one row, written when the database is
-- first opened (the relay draws it from crypto/rand) and anew by every
-- restore, which may bring back an older history.
CREATE TABLE store_epoch (
	id    INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
	epoch TEXT    NOT NULL
);
