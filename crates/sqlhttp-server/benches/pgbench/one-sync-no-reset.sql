-- One Sync and no reset at all: the floor of a read in its own transaction (not a design).
\set k random(1, 10000)
\startpipeline
BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '5000', true), pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SELECT k, v FROM kv WHERE k = :k;
ROLLBACK;
\endpipeline
