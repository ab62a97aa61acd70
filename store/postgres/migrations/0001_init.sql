-- Names compare bytewise (COLLATE "C") so that index order, lock order and
-- directory paging agree with the byte order clients and Go sort in.

-- One row per device. head, cursor and the pending counters change on every
-- send and ack; the fill factor leaves room on each page for HOT updates,
-- since none of those columns is indexed.
CREATE TABLE devices (
    household     text COLLATE "C" NOT NULL,
    name          text COLLATE "C" NOT NULL,
    cursor        bigint NOT NULL DEFAULT 0,
    head          bigint NOT NULL DEFAULT 0,
    pending_count bigint NOT NULL DEFAULT 0,
    pending_bytes bigint NOT NULL DEFAULT 0,
    identity_key  bytea,
    push_kind     text NOT NULL DEFAULT '',
    push_address  text NOT NULL DEFAULT '',
    registered_at timestamptz NOT NULL,
    last_seen     timestamptz NOT NULL,
    PRIMARY KEY (household, name)
) WITH (fillfactor = 70);

-- One record per (household, sender, id): the dedupe key and the stored
-- answer of a send. deliveries is filled in by the send's own transaction
-- before it commits, so no reader ever sees it empty. Expiry pages through
-- old records by (created_at, id).
CREATE TABLE sends (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    household  text COLLATE "C" NOT NULL,
    sender     text COLLATE "C" NOT NULL,
    send_id    text COLLATE "C" NOT NULL,
    digest     bytea NOT NULL,
    deliveries jsonb,
    created_at timestamptz NOT NULL,
    UNIQUE (household, sender, send_id)
);
CREATE INDEX sends_created_at ON sends (created_at, id);

-- One row per recipient's copy. The primary key carries size so that a
-- poll's first read (seqs and sizes) is answered from the index alone.
CREATE TABLE envelopes (
    household text COLLATE "C" NOT NULL,
    device    text COLLATE "C" NOT NULL,
    seq       bigint NOT NULL,
    send_ref  bigint NOT NULL,
    sender    text NOT NULL,
    send_id   text NOT NULL,
    sent_at   timestamptz NOT NULL,
    size      integer NOT NULL,
    payload   bytea NOT NULL,
    PRIMARY KEY (household, device, seq) INCLUDE (size)
);
-- Payloads are encrypted by clients: compressing them only costs CPU.
ALTER TABLE envelopes ALTER COLUMN payload SET STORAGE EXTERNAL;
-- Expiry walks envelopes by age; send expiry asks whether a send still has
-- an envelope.
CREATE INDEX envelopes_sent_at ON envelopes (sent_at);
CREATE INDEX envelopes_send_ref ON envelopes (send_ref);

-- The last removal of each device, to refuse tokens issued before it.
CREATE TABLE removals (
    household  text COLLATE "C" NOT NULL,
    device     text COLLATE "C" NOT NULL,
    removed_at timestamptz NOT NULL,
    PRIMARY KEY (household, device)
);
