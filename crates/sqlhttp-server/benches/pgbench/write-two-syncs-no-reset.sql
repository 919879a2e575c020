-- write-two-syncs without the session's reset after the COMMIT (-M prepared): what the reset costs.
\set k random(1, 10000)
\startpipeline
BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '1000', true), EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text;
SAVEPOINT _sqlhttp_guard_0123456789abcdef;
SELECT k, v FROM kv WHERE k = :k;
\endpipeline
\startpipeline
SET LOCAL statement_timeout = 5000;
SET CONSTRAINTS ALL IMMEDIATE;
RELEASE SAVEPOINT _sqlhttp_guard_0123456789abcdef;
SELECT _sqlhttp.check_transaction(EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp()));
COMMIT;
SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
\endpipeline
