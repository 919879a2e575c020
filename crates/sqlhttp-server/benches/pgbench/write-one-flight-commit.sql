-- An unflagged point read that wrote nothing, ended in ONE flight (ADR 0069): the write's
-- opening, the statement, the session's timeout, a savepoint and a check that raises when a
-- transaction id was assigned (not here), the guard's release, COMMIT, the position and the
-- whole reset after a write, one Sync (every statement prepared here; the engine parses them).
\set k random(1, 10000)
\startpipeline
BEGIN READ WRITE, ISOLATION LEVEL READ COMMITTED;
SELECT pg_catalog.set_config('statement_timeout', '5000', true), pg_catalog.set_config('lock_timeout', '1000', true), EXTRACT(EPOCH FROM pg_catalog.transaction_timestamp())::pg_catalog.text;
SAVEPOINT _sqlhttp_guard_0123456789abcdef;
SELECT k, v FROM kv WHERE k = :k;
SET statement_timeout = 5000;
SAVEPOINT _sqlhttp_written;
SELECT _sqlhttp.check_wrote_nothing();
RELEASE SAVEPOINT _sqlhttp_guard_0123456789abcdef;
COMMIT;
SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text;
SET SESSION AUTHORIZATION DEFAULT;
RESET ROLE;
RESET ALL;
SELECT _sqlhttp.reset_request();
\endpipeline
