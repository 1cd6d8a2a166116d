-- 0001: the orders ledger. One row per confirmed purchase; order_id is the
-- primary key, so a redelivered stream entry can never make a second row.
CREATE TABLE orders (
    order_id   text        PRIMARY KEY,
    sku        text        NOT NULL,
    user_id    text        NOT NULL,
    qty        integer     NOT NULL CHECK (qty > 0),
    bucket     integer     NOT NULL,
    shard_tag  text        NOT NULL,
    stream_id  text        NOT NULL,
    created_at timestamptz NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orders_sku ON orders (sku);
