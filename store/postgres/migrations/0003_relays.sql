-- One row per relay process sharing this database: how its wake-ups
-- fare. Relays read each other's rows once a second, so that a relay whose
-- wake-ups are lost makes the others fall back to re-reading the store.
CREATE TABLE relays (
    id       text COLLATE "C" PRIMARY KEY,
    wakes_ok boolean NOT NULL,
    at       timestamptz NOT NULL
);
