-- One row per relay process sharing this database: how its wake-ups fare.
CREATE TABLE relays (
	id       TEXT    NOT NULL PRIMARY KEY,
	wakes_ok INTEGER NOT NULL,
	at       INTEGER NOT NULL -- Unix microseconds
) WITHOUT ROWID;
