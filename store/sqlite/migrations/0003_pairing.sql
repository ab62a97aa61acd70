-- Invitations to pair a device, and the renewal secrets of paired devices.
-- Both keep only the SHA-256 of their secret.
CREATE TABLE invitations (
	code_hash    BLOB    NOT NULL PRIMARY KEY,
	household    TEXT    NOT NULL,
	device       TEXT    NOT NULL,
	scope        TEXT    NOT NULL,
	created_at   INTEGER NOT NULL, -- Unix microseconds
	expires_at   INTEGER NOT NULL,
	redeemed_at  INTEGER,          -- NULL: not redeemed
	identity_key BLOB              -- the key the redeeming device gave
) WITHOUT ROWID;
CREATE INDEX invitations_device ON invitations (household, device);

CREATE TABLE renewal_secrets (
	secret_hash BLOB    NOT NULL PRIMARY KEY,
	household   TEXT    NOT NULL,
	device      TEXT    NOT NULL,
	scope       TEXT    NOT NULL,
	issued_at   INTEGER NOT NULL, -- Unix microseconds
	expires_at  INTEGER NOT NULL,
	used_at     INTEGER,          -- NULL: not used
	successor   BLOB,             -- the secret issued in exchange
	revoked_at  INTEGER           -- NULL: not revoked
) WITHOUT ROWID;
CREATE INDEX renewal_secrets_device ON renewal_secrets (household, device);
