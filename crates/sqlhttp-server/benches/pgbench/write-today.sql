-- An unflagged point read as the driver's path sends it (ADR 0034): BEGIN's message, the
-- statement, the COMMIT's message and the reset (-M simple: every statement parsed each time).
\set k random(1, 10000)
BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED \; SET LOCAL statement_timeout = 5000 \; SET LOCAL lock_timeout = 1000 \; SAVEPOINT _sqlhttp_guard_0123456789abcdef \; SELECT EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text;
SELECT k, v FROM kv WHERE k = :k;
SET LOCAL statement_timeout = 5000 \; SET CONSTRAINTS ALL IMMEDIATE \; RELEASE SAVEPOINT _sqlhttp_guard_0123456789abcdef \; SELECT _sqlhttp.check_transaction(EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())) \; COMMIT \; SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SET SESSION AUTHORIZATION DEFAULT \; RESET ROLE \; RESET ALL \; SELECT _sqlhttp.reset_request();
