-- Orders the orders feed could not read (Get order answered 404, a body that never parsed, or
-- kept failing). While `attempts` is below the feed's limit, the order's events stay
-- uncommitted and VTEX delivers them again after the visibility timeout; from the limit on
-- they are committed, and every drain re-reads the order by id until it lands. A row goes
-- away when its order lands.
CREATE TABLE raw_vtex.orders_to_reread (
    tenant_id       text NOT NULL,
    order_id        text NOT NULL,
    attempts        integer NOT NULL CHECK (attempts > 0),
    last_error      text NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id)
);
