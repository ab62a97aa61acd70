-- Devices of every household. cursor is the highest seq acknowledged, head
-- the highest seq ever given; pending_* count what lies between them and
-- enforce the queue limits without scanning envelopes.
CREATE TABLE devices (
	household     TEXT    NOT NULL,
	name          TEXT    NOT NULL,
	cursor        INTEGER NOT NULL DEFAULT 0,
	head          INTEGER NOT NULL DEFAULT 0,
	pending_count INTEGER NOT NULL DEFAULT 0,
	pending_bytes INTEGER NOT NULL DEFAULT 0,
	identity_key  BLOB,
	push_kind     TEXT    NOT NULL DEFAULT '',
	push_address  TEXT    NOT NULL DEFAULT '',
	registered_at INTEGER NOT NULL, -- Unix microseconds
	last_seen     INTEGER NOT NULL, -- Unix microseconds
	PRIMARY KEY (household, name)
) WITHOUT ROWID;

-- One row per (household, sender, id): the dedupe record and the stored
-- answer. digest is sha256 over the sorted recipients and the payload.
CREATE TABLE sends (
	id         INTEGER PRIMARY KEY,
	household  TEXT    NOT NULL,
	sender     TEXT    NOT NULL,
	send_id    TEXT    NOT NULL,
	digest     BLOB    NOT NULL,
	deliveries TEXT    NOT NULL, -- JSON [{"d":device,"s":seq}], ordered by device
	created_at INTEGER NOT NULL, -- Unix microseconds
	UNIQUE (household, sender, send_id)
);
CREATE INDEX sends_created_at ON sends (created_at);

-- One copy of a send per recipient. A rowid table: payloads reach 64 KiB,
-- too large for a WITHOUT ROWID b-tree.
CREATE TABLE envelopes (
	household TEXT    NOT NULL,
	device    TEXT    NOT NULL,
	seq       INTEGER NOT NULL,
	send_ref  INTEGER NOT NULL REFERENCES sends (id),
	sender    TEXT    NOT NULL,
	send_id   TEXT    NOT NULL,
	sent_at   INTEGER NOT NULL, -- Unix microseconds
	size      INTEGER NOT NULL,
	payload   BLOB    NOT NULL,
	PRIMARY KEY (household, device, seq),
	FOREIGN KEY (household, device) REFERENCES devices (household, name)
);
CREATE INDEX envelopes_send_ref ON envelopes (send_ref);
CREATE INDEX envelopes_sent_at ON envelopes (sent_at);

-- The last removal of each device, so that its older tokens stay refused
-- after it registers again.
CREATE TABLE removals (
	household  TEXT    NOT NULL,
	device     TEXT    NOT NULL,
	removed_at INTEGER NOT NULL, -- Unix microseconds
	PRIMARY KEY (household, device)
) WITHOUT ROWID;
