-- The table and the reset function a read of `sqlhttpd` meets, for scripts/pgbench-read-cost:
-- the gateway bench's table (10 000 point rows) and `_sqlhttp.reset_after_read` as
-- engine/postgres/setup.rs installs it (its dblink check finds no extension here), and for a
-- write's scripts `_sqlhttp.check_transaction` and `_sqlhttp.reset_request` as it installs them.
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

CREATE OR REPLACE FUNCTION _sqlhttp.check_transaction(opened pg_catalog.numeric) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp()) IS DISTINCT FROM opened THEN
        RAISE EXCEPTION 'not the transaction the server opened' USING ERRCODE = 'SQLHT';
    END IF;
END $$;
CREATE OR REPLACE FUNCTION _sqlhttp.reset_request() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    statement text;
BEGIN
    DISCARD TEMP;
    DISCARD SEQUENCES;
    FOR statement IN SELECT p.name FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql
    LOOP
        EXECUTE pg_catalog.format('DEALLOCATE %I', statement);
    END LOOP;
    PERFORM pg_catalog.setseed(pg_catalog.float8div(
        pg_catalog.hashtextextended(pg_catalog.gen_random_uuid()::pg_catalog.text, 0)
            ::pg_catalog.float8,
        9223372036854775807::pg_catalog.float8));
    PERFORM pg_catalog.pg_advisory_unlock_all();
    EXECUTE 'CLOSE ALL';
    UNLISTEN *;
    SET default_transaction_read_only = on;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e
               WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN
        PERFORM _sqlhttp.close_links();
    END IF;
END $$;

CREATE OR REPLACE FUNCTION _sqlhttp.check_wrote_nothing() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL
        OR EXISTS (SELECT FROM pg_catalog.pg_cursors AS c WHERE c.is_holdable)
        OR EXISTS (SELECT FROM pg_catalog.pg_foreign_table) THEN
        RAISE EXCEPTION 'the transaction may keep a write at COMMIT' USING ERRCODE = 'SQLHW';
    END IF;
END $$;
