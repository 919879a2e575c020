-- write-one-flight-commit with the reset cut to what a COMMIT with no transaction id can
-- leave: settings and role, currval, held cursors, listens, and what outlives any end (the
-- read's reset). No DISCARD TEMP: a temporary table takes an id.
\set k random(1, 10000)
\startpipeline
BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '1000', true), EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text;
SAVEPOINT _sqlhttp_guard_0123456789abcdef;
SELECT k, v FROM kv WHERE k = :k;
SET statement_timeout = 5000;
SAVEPOINT _sqlhttp_written;
SELECT _sqlhttp.check_wrote_nothing();
RELEASE SAVEPOINT _sqlhttp_guard_0123456789abcdef;
COMMIT;
SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SET SESSION AUTHORIZATION DEFAULT;
RESET ROLE;
RESET ALL;
SET default_transaction_read_only = on;
DISCARD SEQUENCES;
CLOSE ALL;
UNLISTEN *;
SELECT pg_catalog.setseed(0.5), pg_catalog.pg_advisory_unlock_all(), CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql) OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN _sqlhttp.reset_after_read(0.5) END;
\endpipeline
