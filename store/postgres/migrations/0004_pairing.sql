-- Invitations to pair a device, and the renewal secrets of paired devices.
-- Both keep only the SHA-256 of their secret.
CREATE TABLE invitations (
    code_hash    bytea PRIMARY KEY,
    household    text COLLATE "C" NOT NULL,
    device       text COLLATE "C" NOT NULL,
    scope        text NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    redeemed_at  timestamptz,  -- NULL: not redeemed
    identity_key bytea         -- the key the redeeming device gave
);
CREATE INDEX invitations_device ON invitations (household, device);

CREATE TABLE renewal_secrets (
    secret_hash bytea PRIMARY KEY,
    household   text COLLATE "C" NOT NULL,
    device      text COLLATE "C" NOT NULL,
    scope       text NOT NULL,
    issued_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,  -- NULL: not used
    successor   bytea,        -- the secret issued in exchange
    revoked_at  timestamptz   -- NULL: not revoked
);
CREATE INDEX renewal_secrets_device ON renewal_secrets (household, device);
