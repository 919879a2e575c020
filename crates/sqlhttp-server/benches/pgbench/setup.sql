-- The table and the reset function a read of `sqlhttpd` meets, for scripts/pgbench-read-cost:
-- the gateway bench's table (10 000 point rows) and `_sqlhttp.reset_after_read` as
-- engine/postgres/setup.rs installs it (its dblink check finds no extension here).
DROP TABLE IF EXISTS kv;
CREATE TABLE kv (k bigint PRIMARY KEY, v text NOT NULL);
INSERT INTO kv SELECT g, 'value-' || g FROM generate_series(1, 10000) AS g;
ANALYZE kv;
CREATE SCHEMA IF NOT EXISTS _sqlhttp;
CREATE OR REPLACE FUNCTION _sqlhttp.close_links() RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE OR REPLACE FUNCTION _sqlhttp.reset_after_read(seed pg_catalog.float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    statement text;
BEGIN
    FOR statement IN SELECT p.name FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql
    LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement);
    END LOOP;
    PERFORM pg_catalog.setseed(seed);
    PERFORM pg_catalog.pg_advisory_unlock_all();
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
               WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN
        PERFORM _sqlhttp.close_links();
    END IF;
END $$;
