-- today.sql without the client's statement: what the server's transaction and reset cost alone.
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ \; SET LOCAL statement_timeout = 5000 \; SET LOCAL lock_timeout = 5000 \; SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
ROLLBACK \; SELECT _sqlhttp.reset_after_read(0.5);
