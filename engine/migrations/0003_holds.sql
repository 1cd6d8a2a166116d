-- 0003: orders that wait for payment. An order is 'paid' when its sale
-- holds no orders; else it starts 'held' and moves once to 'paid',
-- 'cancelled' or 'expired' (and from those two back to 'paid' by a late
-- payment that retook a unit). Each move is a row of order_events, keyed by
-- (order_id, version), so a re-delivered event is never a second row; the
-- orders row carries the highest version applied, so events apply in order
-- whatever order they arrive in, even before their order's row. An event
-- carries its units: cancelled and expired ones went back on sale, a retake
-- took them again, so reconcile counts units out = orders - returned +
-- retaken, exactly.
ALTER TABLE orders
    ADD COLUMN status       text        NOT NULL DEFAULT 'paid'
        CHECK (status IN ('held', 'paid', 'cancelled', 'expired')),
    ADD COLUMN version      integer     NOT NULL DEFAULT 1,
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN paid_at      timestamptz,
    ADD COLUMN cancelled_at timestamptz,
    ADD COLUMN expired_at   timestamptz,
    ADD COLUMN payment_ref  text;
CREATE TABLE order_events (
    order_id    text        NOT NULL,
    version     integer     NOT NULL CHECK (version >= 2),
    kind        text        NOT NULL CHECK (kind IN ('paid', 'cancelled', 'expired')),
    at          timestamptz NOT NULL,
    payment_ref text,
    qty         integer     NOT NULL CHECK (qty > 0),
    -- A late payment that took its units again (they had gone back).
    retake      boolean     NOT NULL,
    shard_tag   text        NOT NULL,
    stream_id   text        NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, version)
);
CREATE INDEX orders_status ON orders (sku, status);
CREATE INDEX order_events_tag ON order_events (shard_tag);
