-- The same ended as a read ends (ADR 0066's option B): ROLLBACK and the read's reset with
-- DISCARD SEQUENCES, one Sync. A notification the statement sent would be dropped.
\set k random(1, 10000)
\startpipeline
BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '1000', true), EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text;
SAVEPOINT _sqlhttp_guard_0123456789abcdef;
SELECT k, v FROM kv WHERE k = :k;
SAVEPOINT _sqlhttp_written;
SELECT _sqlhttp.check_wrote_nothing();
ROLLBACK;
SELECT pg_catalog.setseed(0.5), pg_catalog.pg_advisory_unlock_all(), CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_prepared_statements AS p WHERE p.from_sql) OR EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{dblink,postgres_fdw}'::pg_catalog.name[])) THEN _sqlhttp.reset_after_read(0.5) END;
DISCARD SEQUENCES;
\endpipeline
