-- 0002: fencing. A resource remembers the highest fencing token that wrote
-- to it; flashsale_fence() refuses a lower one, so a lock holder that paused
-- past its lease cannot overwrite the work of the holder that came after it.
CREATE TABLE fencing_tokens (
    resource   text        PRIMARY KEY,
    token      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION flashsale_fence(p_resource text, p_token bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fencing_tokens AS f (resource, token) VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
    WHERE f.token <= EXCLUDED.token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stale fencing token % for %', p_token, p_resource
            USING ERRCODE = 'FS001';
    END IF;
END $$;

-- Results of `flashsale reconcile`, written under the reconcile lock with its
-- fencing token.
CREATE TABLE ledger_checks (
    id            bigserial   PRIMARY KEY,
    checked_at    timestamptz NOT NULL DEFAULT now(),
    sku           text        NOT NULL,
    initial       bigint      NOT NULL,
    remaining     bigint      NOT NULL,
    pending       bigint      NOT NULL,
    written       bigint      NOT NULL,
    conserved     boolean     NOT NULL,
    fencing_token bigint      NOT NULL
);
