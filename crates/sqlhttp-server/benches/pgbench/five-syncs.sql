-- The same read as prepared statements, each with its own Sync (-M prepared): five Syncs.
\set k random(1, 10000)
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '5000', true), pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SELECT k, v FROM kv WHERE k = :k;
ROLLBACK;
SELECT _sqlhttp.reset_after_read(0.5);
