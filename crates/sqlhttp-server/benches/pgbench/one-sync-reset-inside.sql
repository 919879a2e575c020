-- One Sync, the layout ADR 0075's review proposed (not a design yet): the timeouts as session
-- options (run with PGOPTIONS='-c statement_timeout=5000 -c lock_timeout=1000'), no settings
-- statement, the reset and the log position read inside the transaction after the statement,
-- then ROLLBACK: three statements around the client's, one transaction. Its catch: the
-- extension look reads pg_extension under the read's REPEATABLE READ snapshot.
\set k random(1, 10000)
\startpipeline
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ;
SELECT k, v FROM kv WHERE k = :k;
SELECT pg_catalog.setseed(0.5), pg_catalog.pg_advisory_unlock_all(), pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text, CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql) OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN _sqlhttp.reset_after_read(0.5) END;
ROLLBACK;
\endpipeline
