-- PostgreSQL twin of ../sqlite/0018_usage_by_time.sql: the same schema, in PostgreSQL's types.
-- The cluster overview (issue 21 item 5) reads every node's and every
-- app's recent usage, and the busiest hosts, by time alone.
CREATE INDEX node_usage_by_time ON node_usage (at);
CREATE INDEX app_usage_by_time ON app_usage (at);
CREATE INDEX traffic_samples_by_time ON traffic_samples (at);
