-- PostgreSQL twin of ../sqlite/0016_certificate_orders.sql: the same schema, in PostgreSQL's types.
-- What users see of each public host's certificate besides the certificate
-- itself: how many ACME orders were placed for the host, and the last
-- failure (a readable, one-line reason; cleared when an order succeeds).
CREATE TABLE certificate_orders (
    host TEXT PRIMARY KEY,
    orders BIGINT NOT NULL DEFAULT 0,
    last_error TEXT,
    last_error_at BIGINT
);
