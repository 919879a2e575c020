-- sqlhttpd's verified read as tokio-postgres sends it (ADR 0037): BEGIN's message, the
-- statement, the end's message, three Syncs (-M simple: the statement is planned each time).
\set k random(1, 10000)
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ \; SET LOCAL statement_timeout = 5000 \; SET LOCAL lock_timeout = 5000 \; SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SELECT k, v FROM kv WHERE k = :k;
ROLLBACK \; SELECT _sqlhttp.reset_after_read(0.5);
