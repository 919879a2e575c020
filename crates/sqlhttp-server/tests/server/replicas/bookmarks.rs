//! Bookmarks the server cannot satisfy, and bookmarks it must hand out (issue 35, finding 8),
//! on PostgreSQL, with and without read replicas, through `sqlhttpd` processes and HTTP alone:
//!
//! - A bookmark past everything the primary has written (from another cluster, a misrouted
//!   answer, a failover to a primary whose log is behind) is refused `409 BOOKMARK_AHEAD` on
//!   every endpoint that takes one, before anything runs, so its client drops it instead of
//!   waiting `--replica-wait` on every read for ever. A bookmark this primary handed out is
//!   never refused, by any server on it, however fast the log moves.
//! - A write whose answer streams (its headers go out before it commits) ends its body with its
//!   commit's bookmark; one whose COMMIT fails ends it with the error, and no bookmark.
//!
//! The cluster is the replica tests' (see `engines::replica_cluster`); each test makes a
//! database of its own on it, and leaves the replicas alone. These tests skip as the other
//! PostgreSQL tests do.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sqlhttp_testkit::ServerProcess;

use crate::common::{WRITER, http_client, post_over_http, sqlhttpd};
use crate::engines::{ReplicaDatabase, client_role, needs_postgres, replica_cluster};

/// Skips the test (with a message) when there is no cluster with replicas.
macro_rules! replica_cluster_or_return {
    ($test:expr) => {
        match replica_cluster($test) {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// Far past anything a test cluster writes: the log position 0x7fff0000/00000000.
const FAR_FUTURE: &str = "7fff000000000000";

/// An answer, fully read.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    text: String,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    /// `Sqlhttp-Bookmark`, checked to be 16 lower-case hex digits.
    fn bookmark(&self) -> String {
        let bookmark = self
            .header("sqlhttp-bookmark")
            .unwrap_or_else(|| panic!("no Sqlhttp-Bookmark on {self:?}"));
        assert!(is_bookmark(bookmark), "{bookmark:?}");
        bookmark.to_owned()
    }

    /// Asserts a 200 and returns the answer.
    fn ok(self) -> Answer {
        assert_eq!(self.status, 200, "{self:?}");
        self
    }

    /// Asserts `409 BOOKMARK_AHEAD`.
    fn ahead(&self, what: &str) {
        assert_eq!(self.status, 409, "{what}: {self:?}");
        assert_eq!(
            self.body["error"]["code"], "BOOKMARK_AHEAD",
            "{what}: {self:?}"
        );
        let message = self.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(FAR_FUTURE) && message.contains("drop the bookmark"),
            "{what}: {message}"
        );
    }
}

/// Whether `text` is 16 lower-case hex digits.
fn is_bookmark(text: &str) -> bool {
    text.len() == 16
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// POSTs `body` to `path` on the server at `url` with the full-access credential and `headers`.
async fn post(url: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let mut all = WRITER.to_vec();
    all.extend_from_slice(headers);
    let (status, headers, bytes) = post_over_http(&http_client(), url, path, &all, body).await;
    Answer {
        status,
        headers,
        text: String::from_utf8_lossy(&bytes).into_owned(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// A statement on `/api/v1/sql`.
async fn sql(url: &str, sql: &str, headers: &[(&str, &str)]) -> Answer {
    post(url, "/api/v1/sql", headers, &json!({"sql": sql})).await
}

/// A verified read on `/api/v1/sql`.
async fn read(url: &str, sql: &str, headers: &[(&str, &str)]) -> Answer {
    post(
        url,
        "/api/v1/sql",
        headers,
        &json!({"sql": sql, "read_only": true}),
    )
    .await
}

/// The rows of `table`, counted on the primary.
async fn count(url: &str, table: &str) -> i64 {
    let answer = sql(url, &format!("SELECT count(*) FROM {table}"), &[])
        .await
        .ok();
    answer.body["rows"][0][0].as_i64().unwrap()
}

/// `sqlhttpd` on `database`'s primary with `replicas` of its replicas (the first ones), a
/// full-access token `writer`; killed on drop.
async fn sqlhttpd_on(database: &ReplicaDatabase, replicas: usize) -> ServerProcess {
    let mut command = sqlhttpd();
    command
        .args(["--database", &database.primary])
        .args(["--client-role", &client_role(&database.primary)])
        .args(["--token", "writer"]);
    for replica in &database.replicas[..replicas] {
        command.args(["--read-replica", replica]);
    }
    command.stderr(Stdio::inherit());
    ServerProcess::spawn_command(command).await.unwrap()
}

/// The servers the tests run on: one without replicas, one with every replica.
async fn servers(database: &ReplicaDatabase) -> [(&'static str, ServerProcess); 2] {
    [
        ("without replicas", sqlhttpd_on(database, 0).await),
        (
            "with replicas",
            sqlhttpd_on(database, database.replicas.len()).await,
        ),
    ]
}

needs_postgres! {
    #[tokio::test]
    async fn a_bookmark_past_the_primarys_log_is_refused_before_anything_runs() {
        let cluster = replica_cluster_or_return!(
            "a_bookmark_past_the_primarys_log_is_refused_before_anything_runs"
        );
        let database = cluster.database().await;
        for (name, server) in servers(&database).await {
            let url = server.url();
            let table = format!("t_{}", name.replace(' ', "_"));
            sql(url, &format!("CREATE TABLE {table} (x INTEGER)"), &[])
                .await
                .ok();
            database.caught_up().await;
            let ahead = [("sqlhttp-bookmark", FAR_FUTURE)];
            let insert = format!("INSERT INTO {table} VALUES (1)");

            sql(url, &insert, &ahead).await.ahead(name);
            read(url, &format!("SELECT count(*) FROM {table}"), &ahead)
                .await
                .ahead(name);
            let primary = [
                ("sqlhttp-bookmark", FAR_FUTURE),
                ("sqlhttp-consistency", "primary"),
            ];
            read(url, "SELECT 1", &primary).await.ahead(name);
            // Upper case names the same position.
            read(
                url,
                "SELECT 1",
                &[("sqlhttp-bookmark", &FAR_FUTURE.to_uppercase())],
            )
            .await
            .ahead(name);
            // A keyed write is refused before its key is claimed: sent again without the bookmark,
            // it runs (it is not a replay of anything).
            // The servers share the database, and so the keys.
            let key = format!("bookmark-ahead-{table}");
            let keyed = [
                ("sqlhttp-bookmark", FAR_FUTURE),
                ("idempotency-key", key.as_str()),
            ];
            sql(url, &insert, &keyed).await.ahead(name);
            for (path, body) in [
                (
                    "/api/v1/batch",
                    json!({"statements": [{"sql": insert}, {"sql": insert}]}),
                ),
                (
                    "/api/v1/batch",
                    json!({"read_only": true, "statements": [{"sql": "SELECT 1"}]}),
                ),
                ("/api/v1/describe", json!({})),
                ("/api/v1/describe", json!({"table": table})),
                ("/api/v1/transaction/open", json!({})),
                (
                    "/api/v1/transaction/open",
                    json!({"read_only": true, "isolation": "repeatable_read"}),
                ),
            ] {
                post(url, path, &ahead, &body)
                    .await
                    .ahead(&format!("{name}: {path} {body}"));
                let batch_key = format!("bookmark-ahead-batch-{table}");
                let keyed_batch = [
                    ("sqlhttp-bookmark", FAR_FUTURE),
                    ("idempotency-key", batch_key.as_str()),
                ];
                if path == "/api/v1/batch" {
                    post(url, path, &keyed_batch, &body)
                        .await
                        .ahead(&format!("{name}: keyed {body}"));
                }
            }
            assert_eq!(count(url, &table).await, 0, "{name}: nothing ran");
            // No transaction was left open by the refused opens.
            let open = sql(
                url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state LIKE 'idle in transaction%'",
                &[],
            )
            .await
            .ok();
            assert_eq!(open.body["rows"][0][0], 0, "{name}: {open:?}");

            let keyed = sql(url, &insert, &[("idempotency-key", key.as_str())])
                .await
                .ok();
            assert_eq!(
                keyed.header("idempotent-replayed"),
                None,
                "{name}: {keyed:?}"
            );
            assert_eq!(count(url, &table).await, 1, "{name}");

            // The bookmark a write just answered is served, on a read and a write alike.
            let written = sql(url, &insert, &[]).await.ok().bookmark();
            let fresh = [("sqlhttp-bookmark", written.as_str())];
            let seen = read(url, &format!("SELECT count(*) FROM {table}"), &fresh)
                .await
                .ok();
            assert_eq!(seen.body["rows"][0][0], 2, "{name}: {seen:?}");
            assert!(seen.bookmark() >= written, "{name}: {seen:?}");
            let again = sql(url, &insert, &fresh).await.ok();
            assert!(again.bookmark() > written, "{name}: {again:?}");
            let open = post(url, "/api/v1/transaction/open", &fresh, &json!({})).await;
            let open = open.ok();
            let token = open.body["transaction"].as_str().unwrap();
            post(
                url,
                "/api/v1/transaction/rollback",
                &[],
                &json!({"transaction": token}),
            )
            .await
            .ok();
        }
    }
}

needs_postgres! {
    /// Bookmarks handed out by one server while writes run on all of them, sent to another at once:
    /// none is refused. The other server has not seen them (its watchers sample the primary every
    /// 250 ms; without replicas it has no watchers at all), so each past what it has seen makes it
    /// ask the primary.
    #[tokio::test]
    async fn a_bookmark_from_this_primary_is_never_ahead_under_concurrent_writes() {
        let cluster = replica_cluster_or_return!(
            "a_bookmark_from_this_primary_is_never_ahead_under_concurrent_writes"
        );
        let database = cluster.database().await;
        let [(_, bare), (_, replicated)] = servers(&database).await;
        let another = sqlhttpd_on(&database, 1).await;
        let urls: Arc<Vec<String>> = Arc::new(
            [&bare, &replicated, &another]
                .iter()
                .map(|server| server.url().to_owned())
                .collect(),
        );
        sql(&urls[0], "CREATE TABLE w (writer INTEGER, n INTEGER)", &[])
            .await
            .ok();
        database.caught_up().await;

        const WRITERS: usize = 6;
        const ROUNDS: usize = 40;
        let served = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let urls = Arc::clone(&urls);
            let served = Arc::clone(&served);
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let from = &urls[(writer + round) % urls.len()];
                    let to = &urls[(writer + round + 1) % urls.len()];
                    let written = sql(
                        from,
                        &format!("INSERT INTO w VALUES ({writer}, {round})"),
                        &[],
                    )
                    .await
                    .ok()
                    .bookmark();
                    let fresh = [("sqlhttp-bookmark", written.as_str())];
                    let seen = read(
                        to,
                        &format!("SELECT count(*) FROM w WHERE writer = {writer}"),
                        &fresh,
                    )
                    .await;
                    assert_eq!(seen.status, 200, "round {round}: {seen:?}");
                    assert_eq!(
                        seen.body["rows"][0][0],
                        round + 1,
                        "round {round}: {seen:?}"
                    );
                    // A write elsewhere with it, too (it runs on the primary whatever the bookmark).
                    let third = &urls[(writer + round + 2) % urls.len()];
                    let wrote = sql(third, "SELECT 1", &fresh).await;
                    assert_eq!(wrote.status, 200, "round {round}: {wrote:?}");
                    served.fetch_add(2, Ordering::Relaxed);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(served.load(Ordering::Relaxed), WRITERS * ROUNDS * 2);
        assert_eq!(
            count(&urls[0], "w").await,
            i64::try_from(WRITERS * ROUNDS).unwrap()
        );
    }
}

/// `INSERT ... RETURNING` of `rows` rows of about 120 bytes each into `table`: past one 32 KiB
/// chunk from about 300 rows on.
fn many_rows(table: &str, rows: u32) -> String {
    format!(
        "INSERT INTO {table} (id, pad) SELECT g, repeat('x', 100) FROM generate_series(1, {rows}) \
         AS g RETURNING id, pad"
    )
}

needs_postgres! {
    #[tokio::test]
    async fn a_streamed_write_ends_its_body_with_its_commits_bookmark() {
        let cluster =
            replica_cluster_or_return!("a_streamed_write_ends_its_body_with_its_commits_bookmark");
        let database = cluster.database().await;
        for (name, server) in servers(&database).await {
            let url = server.url();
            let table = format!("big_{}", name.replace(' ', "_"));
            let before = sql(
                url,
                &format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, pad TEXT)"),
                &[],
            )
            .await
            .ok()
            .bookmark();

            let streamed = sql(url, &many_rows(&table, 5000), &[]).await.ok();
            assert_eq!(
                streamed.header("sqlhttp-bookmark"),
                None,
                "{name}: its headers went out before it committed"
            );
            assert_eq!(
                streamed.header("content-length"),
                None,
                "{name}: it streamed"
            );
            let body = streamed.body.as_object().unwrap();
            let keys: Vec<&str> = body.keys().map(String::as_str).collect();
            let mut in_order = keys.clone();
            in_order.sort_by_key(|key| streamed.text.find(&format!("\"{key}\":")).unwrap());
            assert_eq!(
                in_order,
                [
                    "columns",
                    "rows",
                    "rows_affected",
                    "last_insert_id",
                    "bookmark",
                    "stats"
                ],
                "{name}"
            );
            assert_eq!(body["rows"].as_array().unwrap().len(), 5000, "{name}");
            assert_eq!(body["rows_affected"], 5000, "{name}");
            let bookmark = body["bookmark"].as_str().unwrap().to_owned();
            assert!(is_bookmark(&bookmark), "{name}: {bookmark:?}");
            assert!(
                streamed.text.contains(&format!(
                    r#""rows_affected":5000,"last_insert_id":null,"bookmark":"{bookmark}","stats":{{"#
                )),
                "{name}: {}",
                &streamed.text[streamed.text.len() - 120..]
            );
            // Ordered between the write before it and the one after it.
            assert!(bookmark > before, "{name}: {bookmark} after {before}");
            let after = sql(url, &format!("INSERT INTO {table} VALUES (0, '')"), &[])
                .await
                .ok()
                .bookmark();
            assert!(after >= bookmark, "{name}: {after} after {bookmark}");

            // The body's bookmark is one this server serves, and a read consistent with it sees
            // the streamed write, wherever it is served.
            let seen = read(
                url,
                &format!("SELECT count(*) FROM {table} WHERE id > 0"),
                &[("sqlhttp-bookmark", &bookmark)],
            )
            .await
            .ok();
            assert_eq!(seen.body["rows"][0][0], 5000, "{name}: {seen:?}");

            // A small write's body is unchanged: its bookmark is in its headers.
            let small = sql(url, &many_rows(&table, 0), &[]).await;
            let small = small.ok();
            assert!(
                small.text.contains(r#""last_insert_id":null,"stats":{"#),
                "{name}: {small:?}"
            );
            small.bookmark();
        }
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_streamed_write_whose_commit_fails_ends_with_the_error_and_no_bookmark() {
        let cluster = replica_cluster_or_return!(
            "a_streamed_write_whose_commit_fails_ends_with_the_error_and_no_bookmark"
        );
        let database = cluster.database().await;
        for (name, server) in servers(&database).await {
            let url = server.url();
            let table = format!("deferred_{}", name.replace(' ', "_"));
            // The foreign key is checked at COMMIT, after every row was written and streamed.
            sql(
                url,
                &format!(
                    "CREATE TABLE {table} (id INTEGER PRIMARY KEY, pad TEXT, \
                 parent INTEGER REFERENCES {table} (id) DEFERRABLE INITIALLY DEFERRED)"
                ),
                &[],
            )
            .await
            .ok();
            let orphaned = format!(
                "INSERT INTO {table} (id, pad, parent) SELECT g, repeat('x', 100), \
             CASE WHEN g = 5000 THEN -1 END FROM generate_series(1, 5000) AS g RETURNING id, pad"
            );
            let failed = sql(url, &orphaned, &[]).await;
            assert_eq!(
                failed.status, 200,
                "{name}: the head went out first: {failed:?}"
            );
            assert_eq!(failed.header("sqlhttp-bookmark"), None, "{name}");
            let body = failed.body.as_object().unwrap_or_else(|| {
                panic!(
                    "{name}: the body is not JSON: ...{}",
                    &failed.text[failed.text.len().saturating_sub(300)..]
                )
            });
            let keys: Vec<&str> = body.keys().map(String::as_str).collect();
            let mut in_order = keys.clone();
            in_order.sort_by_key(|key| failed.text.find(&format!("\"{key}\":")).unwrap());
            assert_eq!(in_order, ["columns", "rows", "error"], "{name}");
            assert_eq!(
                body["error"]["code"], "CONSTRAINT_VIOLATION",
                "{name}: {body:?}"
            );
            assert_eq!(body["rows"].as_array().unwrap().len(), 5000, "{name}");
            assert_eq!(count(url, &table).await, 0, "{name}: nothing was kept");

            // A write whose answer fails after its first chunk (PostgreSQL computes a RETURNING
            // whole before sending it, so a row past the server's value limit, refused as it
            // arrives): the error member, no bookmark either.
            let failing = format!(
                "INSERT INTO {table} (id, pad) SELECT g, repeat('x', 100) \
             FROM generate_series(1, 5000) AS g \
             RETURNING id, CASE WHEN id = 4000 THEN repeat('x', 5000000) ELSE pad END"
            );
            let failed = sql(url, &failing, &[]).await;
            assert_eq!(failed.status, 200, "{name}: {failed:?}");
            assert_eq!(
                failed.body["error"]["code"], "SQL_ERROR",
                "{name}: {failed:?}"
            );
            assert_eq!(
                failed.body["rows"].as_array().unwrap().len(),
                3999,
                "{name}"
            );
            assert!(failed.body.get("bookmark").is_none(), "{name}");
            assert!(failed.body.get("rows_affected").is_none(), "{name}");
            assert_eq!(count(url, &table).await, 0, "{name}: nothing was kept");
        }
    }
}
