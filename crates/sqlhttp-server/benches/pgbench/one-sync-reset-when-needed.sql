-- One Sync, the reset as the engine sends it since ADR 0065: the seed and advisory locks
-- inline, the PL/pgSQL function called only when a client's function left a statement
-- prepared from SQL text or an extension with links is installed (neither here).
\set k random(1, 10000)
\startpipeline
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '5000', true), pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SELECT k, v FROM kv WHERE k = :k;
ROLLBACK;
SELECT pg_catalog.setseed(0.5), pg_catalog.pg_advisory_unlock_all(), CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql) OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN _sqlhttp.reset_after_read(0.5) END;
\endpipeline
