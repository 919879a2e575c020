-- One Sync, with the reset written inline (no PL/pgSQL call): the seed, advisory locks, and
-- the two checks whose answer says whether the rare part of the reset must follow.
\set k random(1, 10000)
\startpipeline
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '5000', true), pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SELECT k, v FROM kv WHERE k = :k;
ROLLBACK;
SELECT pg_catalog.setseed(0.5), pg_catalog.pg_advisory_unlock_all(), EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql), EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[]));
\endpipeline
