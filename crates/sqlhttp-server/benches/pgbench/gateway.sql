-- What the hand-written gateway sends for a point read: one statement, one Sync (-M prepared).
\set k random(1, 10000)
SELECT k, v FROM kv WHERE k = :k;
