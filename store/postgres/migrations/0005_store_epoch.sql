-- The store's epoch (store.History): one row, written by the first
-- connection of a relay to find it missing (the relay draws the epoch from
-- crypto/rand). Every new connection checks the server's timeline against
-- the row's: a promoted standby is on a new timeline, and unless the
-- primary it replaced committed synchronously (synchronous), it may lack
-- the last commits, so the epoch changes (timeline.go).
CREATE TABLE store_epoch (
    id          integer PRIMARY KEY CHECK (id = 1),
    epoch       text    NOT NULL,
    timeline    text    NOT NULL, -- the first 8 hex digits of the WAL file name
    synchronous boolean NOT NULL  -- the primary it was recorded on committed synchronously
);
