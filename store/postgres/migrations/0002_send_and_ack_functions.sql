-- A send and a batch of acks, each one call of a server-side function, so
-- that either costs one round trip in autocommit. docs/FANOUT.md explains
-- how each locks; a refusal raises one of these SQLSTATEs, which aborts the
-- call and with it everything the call wrote:
--
--   RL001 unknown recipient (DETAIL: the first one in name order)
--   RL002 recipient's queue full (DETAIL: the first one in name order)
--   RL003 household's pending bytes over its bound
--   RL004 id already used with other recipients or payload
--   RL005 the id's record was deleted by expiry between claim and read
--
-- The functions are VOLATILE: in READ COMMITTED each statement in them
-- takes a fresh snapshot, which both rely on to see rows committed while
-- they waited for a lock.

CREATE FUNCTION relay_send(
    p_household text, p_sender text, p_send_id text, p_digest bytea,
    p_to text[], p_payload bytea, p_now timestamptz,
    p_max_count bigint, p_max_bytes bigint, p_max_household_bytes bigint)
RETURNS TABLE (to_device text, to_seq bigint, to_push_kind text, to_push_address text,
               to_pending boolean, to_repeat boolean, to_removed_at timestamptz)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_ref        bigint;
    v_digest     bytea;
    v_deliveries jsonb;
    v_size       bigint := octet_length(p_payload);
    v_names      text[];
    v_counts     bigint[];
    v_bytes      bigint[];
    v_bad        text;
    v_household  bigint;
BEGIN
    -- The claim. A concurrent identical send waits here on the unique
    -- index until the first commits (no row comes back) or rolls back (the
    -- key is ours).
    INSERT INTO sends (household, sender, send_id, digest, created_at)
    VALUES (p_household, p_sender, p_send_id, p_digest, p_now)
    ON CONFLICT (household, sender, send_id) DO NOTHING
    RETURNING id INTO v_ref;

    IF v_ref IS NULL THEN
        -- A repeat. This statement's snapshot is taken after the claim
        -- stopped waiting, so it sees the record the claim collided with.
        SELECT id, digest, deliveries
        FROM sends
        WHERE household = p_household AND sender = p_sender AND send_id = p_send_id
        INTO v_ref, v_digest, v_deliveries;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'send record expired meanwhile' USING ERRCODE = 'RL005';
        END IF;
        IF v_digest <> p_digest THEN
            RAISE EXCEPTION 'send id used with other content' USING ERRCODE = 'RL004';
        END IF;
        -- The stored answer, with each recipient's push target now and
        -- whether its copy of this send (send_ref: not a later
        -- registration's envelope at the same seq) is still stored.
        RETURN QUERY
        SELECT a.device, a.seq, coalesce(d.push_kind, ''), coalesce(d.push_address, ''),
               EXISTS (SELECT 1 FROM envelopes e
                       WHERE e.household = p_household AND e.device = a.device
                         AND e.seq = a.seq AND e.send_ref = v_ref),
               true, r.removed_at
        FROM jsonb_to_recordset(v_deliveries) AS a(device text, seq bigint)
        LEFT JOIN devices d ON d.household = p_household AND d.name = a.device
        LEFT JOIN removals r ON r.household = p_household AND r.device = a.device
        ORDER BY a.device COLLATE "C";
        RETURN;
    END IF;

    -- Lock the recipients in name order and hold them until commit. Every
    -- send locks in this one order, so two sends whose recipients overlap
    -- queue behind each other instead of deadlocking.
    SELECT array_agg(l.name), array_agg(l.pending_count), array_agg(l.pending_bytes)
    FROM (SELECT name, pending_count, pending_bytes
          FROM devices
          WHERE household = p_household AND name = ANY (p_to)
          ORDER BY name
          FOR UPDATE) l
    INTO v_names, v_counts, v_bytes;

    IF v_names IS DISTINCT FROM p_to THEN
        SELECT t FROM unnest(p_to) AS t
        WHERE t <> ALL (coalesce(v_names, '{}'))
        ORDER BY t COLLATE "C" LIMIT 1
        INTO v_bad;
        RAISE EXCEPTION 'unknown device' USING ERRCODE = 'RL001', DETAIL = v_bad;
    END IF;

    SELECT n
    FROM unnest(v_names, v_counts, v_bytes) AS r(n, c, b)
    WHERE p_max_count > 0 AND r.c + 1 > p_max_count
       OR p_max_bytes > 0 AND r.b + v_size > p_max_bytes
    ORDER BY n COLLATE "C" LIMIT 1
    INTO v_bad;
    IF FOUND THEN
        RAISE EXCEPTION 'queue full' USING ERRCODE = 'RL002', DETAIL = v_bad;
    END IF;

    IF p_max_household_bytes > 0 THEN
        -- No lock on the other devices: a fresh snapshot, exact for the
        -- recipients (held) and as of now for the rest.
        SELECT coalesce(sum(pending_bytes), 0)
        FROM devices WHERE household = p_household
        INTO v_household;
        IF v_household + v_size * cardinality(p_to) > p_max_household_bytes THEN
            RAISE EXCEPTION 'household full' USING ERRCODE = 'RL003';
        END IF;
    END IF;

    -- Give each recipient its next seq, store its copy (the payload crossed
    -- the wire once, whatever the fan-out), record the answer for repeats.
    -- Each recipient's last removal comes back too: a relay that hands the
    -- envelope to a held poll from memory checks the poll's token by it.
    RETURN QUERY
    WITH bumped AS (
        UPDATE devices
        SET head = head + 1,
            pending_count = pending_count + 1,
            pending_bytes = pending_bytes + v_size
        WHERE household = p_household AND name = ANY (p_to)
        RETURNING name, head, push_kind, push_address
    ), stored AS (
        INSERT INTO envelopes (household, device, seq, send_ref, sender, send_id, sent_at, size, payload)
        SELECT p_household, name, head, v_ref, p_sender, p_send_id, p_now, v_size, p_payload FROM bumped
    ), answered AS (
        UPDATE sends
        SET deliveries = (SELECT jsonb_agg(jsonb_build_object('device', name, 'seq', head)) FROM bumped)
        WHERE id = v_ref
    )
    SELECT b.name, b.head, b.push_kind, b.push_address, true, false, r.removed_at
    FROM bumped b
    LEFT JOIN removals r ON r.household = p_household AND r.device = b.name
    ORDER BY b.name;
END
$$;

CREATE FUNCTION relay_ack_many(
    p_households text[], p_devices text[], p_cursors bigint[], p_seen timestamptz[],
    p_removed timestamptz[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_households text[];
    v_devices    text[];
    v_from       bigint[];
    v_to         bigint[];
    v_seen       timestamptz[];
    v_deleted    bigint;
BEGIN
    -- Lock the named devices that exist in (household, name) order, the
    -- order sends and expiry lock in, before any envelope is touched. A
    -- device named twice is one row with the highest cursor and the latest
    -- time. The cursor moves up only, and never past the head read under
    -- the lock. An ack taken before a removal the caller had not heard of
    -- (p_removed older than the recorded one) belongs to an earlier life
    -- of the name and is skipped.
    SELECT array_agg(l.household), array_agg(l.name), array_agg(l.cursor),
           array_agg(l.new_cursor), array_agg(l.seen)
    FROM (SELECT d.household, d.name, d.cursor,
                 GREATEST(d.cursor, LEAST(a.cursor, d.head)) AS new_cursor, a.seen
          FROM devices d
          JOIN (SELECT household, device, max(cursor) AS cursor, max(seen) AS seen, max(removed) AS removed
                FROM unnest(p_households, p_devices, p_cursors, p_seen, p_removed) AS u(household, device, cursor, seen, removed)
                GROUP BY household, device) a
            ON d.household = a.household AND d.name = a.device
          LEFT JOIN removals r ON r.household = d.household AND r.device = d.name
          WHERE r.removed_at IS NULL OR r.removed_at <= a.removed
          ORDER BY d.household, d.name
          FOR UPDATE OF d) l
    INTO v_households, v_devices, v_from, v_to, v_seen;

    IF v_households IS NULL THEN
        RETURN 0;
    END IF;

    -- A statement of its own, so its snapshot is taken with every row
    -- held: it sees each envelope a send committed while we waited, and no
    -- new one can come (a send needs the row). Rows at or below the old
    -- cursor went when it moved there; only the new range is deleted.
    WITH v AS (
        SELECT * FROM unnest(v_households, v_devices, v_from, v_to, v_seen) AS v(household, device, lo, hi, seen)
    ), gone AS (
        DELETE FROM envelopes e
        USING v
        WHERE e.household = v.household AND e.device = v.device AND e.seq > v.lo AND e.seq <= v.hi
        RETURNING e.household, e.device, e.size
    ), freed AS (
        SELECT household, device, count(*) AS n, sum(size) AS bytes
        FROM gone GROUP BY household, device
    ), moved AS (
        UPDATE devices d
        SET cursor = v.hi,
            pending_count = d.pending_count - coalesce(f.n, 0),
            pending_bytes = d.pending_bytes - coalesce(f.bytes, 0),
            last_seen = GREATEST(d.last_seen, v.seen)
        FROM v LEFT JOIN freed f ON f.household = v.household AND f.device = v.device
        WHERE d.household = v.household AND d.name = v.device
          AND (v.hi > v.lo OR v.seen > d.last_seen)
    )
    SELECT count(*) FROM gone
    INTO v_deleted;
    RETURN v_deleted;
END
$$;
