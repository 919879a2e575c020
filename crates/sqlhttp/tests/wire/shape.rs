//! What goes on the wire, and what comes back decoded: path, method, headers, JSON body; typed rows,
//! tables, effects, inserts; secrets kept out of every printable form.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlhttp::{Client, ErrorKind};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::support::*;

#[tokio::test]
async fn query_sends_sql_and_bound_params_as_json() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .and(header("content-type", "application/json"))
        .and(header("accept", "application/json"))
        .and(header("authorization", "Bearer s3cr3t"))
        .and(header("sqlhttp-attempt", "1/3"))
        .and(body_json(json!({
            "sql": "SELECT id FROM t WHERE a = ? AND b = ? AND c = ? AND d IS ? AND e = ?",
            "params": [1, "two", 3.5, null, true],
            "read_only": true,
        })))
        .respond_with(ok_rows(&["id"], &json!([[1]])))
        .expect(1)
        .mount(&server)
        .await;
    let client = builder(&server).bearer_token("s3cr3t").build().unwrap();
    let ids: Vec<i64> = client
        .query("SELECT id FROM t WHERE a = ? AND b = ? AND c = ? AND d IS ? AND e = ?")
        .bind(1)
        .bind("two")
        .bind(3.5)
        .bind(Option::<i64>::None)
        .bind(true)
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(ids, vec![1]);
}

#[tokio::test]
async fn a_statement_without_params_omits_them_and_the_user_agent_is_set() {
    let server = server().await;
    respond_always(&server, ok_rows(&["1"], &json!([[1]]))).await;
    let client = builder(&server).user_agent("my-app/1.0").build().unwrap();
    client.ping().await.unwrap();
    let requests = server.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body, json!({"sql": "SELECT 1", "read_only": true}));
    assert_eq!(requests[0].headers.get("user-agent").unwrap(), "my-app/1.0");
    assert!(requests[0].headers.get("authorization").is_none());
    assert!(requests[0].headers.get("idempotency-key").is_none());
}

#[tokio::test]
async fn reads_are_marked_read_only_and_statements_run_for_their_effect_are_not() {
    let server = server().await;
    respond_always(&server, ok_rows(&["x"], &json!([[1]]))).await;
    let client = builder(&server).build().unwrap();
    let _: Vec<i64> = client.query("SELECT 1 AS x").fetch_all().await.unwrap();
    let _: i64 = client.query("SELECT 1 AS x").fetch_one().await.unwrap();
    let _: Option<i64> = client
        .query("SELECT 1 AS x")
        .fetch_optional()
        .await
        .unwrap();
    let mut rows = client.query("SELECT 1 AS x").fetch::<i64>();
    while rows.try_next().await.unwrap().is_some() {}
    client.query_table("SELECT 1 AS x").await.unwrap();
    let reads = server.received_requests().await.unwrap().len();
    client.execute("UPDATE t SET x = 1").await.unwrap();
    let _: Vec<i64> = client
        .execute("DELETE FROM t RETURNING x")
        .fetch_all()
        .await
        .unwrap();
    let mut rows = client.execute("DELETE FROM t RETURNING x").fetch::<i64>();
    while rows.try_next().await.unwrap().is_some() {}
    client
        .execute("DELETE FROM t RETURNING x")
        .fetch_table()
        .await
        .unwrap();
    let requests = server.received_requests().await.unwrap();
    for (index, request) in requests.iter().enumerate() {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        let expected = (index < reads).then_some(json!(true));
        assert_eq!(
            body.get("read_only").cloned(),
            expected,
            "request {index}: {body}"
        );
    }
    assert_eq!(requests.len(), reads + 4);
}

#[tokio::test]
async fn a_base_url_with_a_path_keeps_it() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/db/api/v1/sql"))
        .respond_with(ok_rows(&["1"], &json!([[1]])))
        .expect(2)
        .mount(&server)
        .await;
    for base in [
        format!("{}/db", server.uri()),
        format!("{}/db/", server.uri()),
    ] {
        let client = Client::builder(base)
            .http_client(plain_http())
            .build()
            .unwrap();
        client.ping().await.unwrap();
    }
}

#[derive(Debug, Deserialize, PartialEq)]
struct Book {
    id: i64,
    title: String,
    year: Option<i64>,
}

#[tokio::test]
async fn rows_decode_into_structs_tuples_and_scalars() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(
            &["id", "title", "year"],
            &json!([[1, "Dune", 1965], [9007199254740993_i64, "Emma", null]]),
        ),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let books: Vec<Book> = client
        .query("SELECT id, title, year FROM books")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(
        books,
        vec![
            Book {
                id: 1,
                title: "Dune".into(),
                year: Some(1965)
            },
            Book {
                id: 9_007_199_254_740_993,
                title: "Emma".into(),
                year: None
            },
        ]
    );
    let tuple: (i64, String, Option<i64>) = client.query("SELECT ...").fetch_one().await.unwrap();
    assert_eq!(tuple, (1, "Dune".to_owned(), Some(1965)));
}

#[tokio::test]
async fn fetch_one_on_no_rows_is_a_typed_error_and_fetch_optional_is_none() {
    let server = server().await;
    respond_always(&server, ok_rows(&["n"], &json!([]))).await;
    let client = builder(&server).build().unwrap();
    let err = client
        .query("SELECT n FROM t")
        .fetch_one::<i64>()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::RowNotFound);
    let none: Option<i64> = client
        .query("SELECT n FROM t")
        .fetch_optional()
        .await
        .unwrap();
    assert_eq!(none, None);
}

#[tokio::test]
async fn a_body_that_does_not_decode_names_row_and_column_and_is_not_retried() {
    let server = server().await;
    respond_always(
        &server,
        ok_rows(&["id", "title", "year"], &json!([[1, "a", 2], [2, 3, 4]])),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let err = client
        .query("SELECT ...")
        .fetch_all::<Book>()
        .await
        .unwrap_err();
    match err.kind() {
        ErrorKind::Decode {
            row,
            column,
            message,
        } => {
            assert_eq!(*row, Some(1));
            assert_eq!(column.as_deref(), Some("title"));
            assert!(message.contains("expected a string"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(hits(&server).await, 1);
}

#[tokio::test]
async fn query_table_keeps_types_and_reads_cells() {
    let server = server().await;
    respond_always(
        &server,
        ResponseTemplate::new(200).set_body_json(json!({
            "columns": [{"name": "id", "type": "INTEGER"}, {"name": "name", "type": "TEXT"}],
            "rows": [[1, "ada"], [2, null]], "rows_affected": 0, "last_insert_id": null,
        })),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let table = client
        .query_table("SELECT id, name FROM people")
        .await
        .unwrap();
    let types: Vec<_> = table
        .columns()
        .iter()
        .map(|c| (c.name(), c.type_name()))
        .collect();
    assert_eq!(types, vec![("id", "INTEGER"), ("name", "TEXT")]);
    let second = table.row(1).unwrap();
    assert_eq!(second.get::<i64>("id").unwrap(), 2);
    assert_eq!(second.get::<Option<String>>("name").unwrap(), None);
    let err = second.get::<String>("name").unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode { row: Some(1), .. }));
    assert!(second.get::<i64>("missing").is_err());
}

#[tokio::test]
async fn execute_returns_the_effect() {
    let server = server().await;
    respond_always(&server, ok_effect(3, Some(17))).await;
    let client = builder(&server).build().unwrap();
    let effect = client.execute("UPDATE t SET a = ?").bind(1).await.unwrap();
    assert_eq!((effect.rows_affected, effect.last_insert_id), (3, Some(17)));
}

#[derive(Serialize)]
struct NewBook<'a> {
    title: &'a str,
    year: Option<i64>,
}

#[tokio::test]
async fn insert_sends_one_parameterized_statement_with_an_idempotency_key() {
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/api/v1/sql"))
        .and(body_json(json!({
            "sql": "INSERT INTO \"books\" (\"title\", \"year\") VALUES (?, ?), (?, ?)",
            "params": ["Dune", 1965, "Robert'); DROP TABLE books;--", null],
        })))
        .respond_with(ok_effect(2, Some(2)))
        .expect(1)
        .mount(&server)
        .await;
    let client = builder(&server).build().unwrap();
    let rows = [
        NewBook {
            title: "Dune",
            year: Some(1965),
        },
        NewBook {
            title: "Robert'); DROP TABLE books;--",
            year: None,
        },
    ];
    assert_eq!(client.insert("books", &rows).await.unwrap(), 2);
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys[0].len(), 32, "128 random bits, hex: {keys:?}");
    assert!(keys[0].bytes().all(|b| b.is_ascii_hexdigit()));
}

#[tokio::test]
async fn insert_chunks_get_their_own_keys_and_a_later_failure_reports_what_was_committed() {
    let server = server().await;
    respond_times(&server, ok_effect(2, Some(2)), 1).await;
    respond_always(
        &server,
        error(409, "CONSTRAINT_VIOLATION", "UNIQUE constraint failed"),
    )
    .await;
    let client = builder(&server).insert_max_params(4).build().unwrap();
    let rows: Vec<_> = (0..4)
        .map(|i| NewBook {
            title: "t",
            year: Some(i),
        })
        .collect();
    let err = client.insert("books", &rows).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::ConstraintViolation { .. }));
    assert_eq!(err.rows_inserted(), Some(2));
    let keys = header_values(&server, "idempotency-key").await;
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);
}

#[tokio::test]
async fn bad_input_fails_before_anything_is_sent() {
    let server = server().await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).insert_max_bytes(300).build().unwrap();
    let err = client
        .query("SELECT ?")
        .bind(vec![1, 2])
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidParameter { index: Some(0), .. }
        ),
        "{err:?}"
    );
    let err = client
        .execute("SELECT ?, ?")
        .bind(1)
        .bind(u64::MAX)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidParameter { index: Some(1), .. }
        ),
        "{err:?}"
    );
    let long = "x".repeat(400);
    let rows = [
        NewBook {
            title: "ok",
            year: None,
        },
        NewBook {
            title: &long,
            year: None,
        },
    ];
    let err = client.insert("books", &rows).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::PayloadTooLarge { .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 0);
    assert_eq!(
        hits(&server).await,
        0,
        "nothing may be sent, not even the first chunk"
    );
}

#[tokio::test]
async fn the_token_never_appears_in_debug_display_or_errors() {
    let server = server().await;
    respond_always(
        &server,
        error(401, "UNAUTHORIZED", "missing or invalid bearer token"),
    )
    .await;
    let builder = builder(&server).bearer_token("tok-very-secret");
    assert!(!format!("{builder:?}").contains("tok-very-secret"));
    let client = builder.build().unwrap();
    assert!(!format!("{client:?}").contains("tok-very-secret"));
    let err = client.ping().await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Unauthorized { .. }));
    for text in [
        format!("{err}"),
        format!("{err:?}"),
        format!("{:?}", err.kind()),
    ] {
        assert!(!text.contains("tok-very-secret"), "{text}");
    }
}

#[test]
fn build_reports_bad_configuration() {
    use sqlhttp::RetryPolicy;
    use std::time::Duration;
    let cases = [
        Client::builder("not a url").build(),
        Client::builder("ftp://example.com").build(),
        Client::builder("http://x")
            .bearer_token("line\nbreak")
            .build(),
        Client::builder("http://x")
            .retry(RetryPolicy::new().with_max_attempts(0))
            .build(),
        Client::builder("http://x")
            .retry(
                RetryPolicy::new()
                    .with_initial_backoff(Duration::from_secs(9))
                    .with_max_backoff(Duration::from_secs(1)),
            )
            .build(),
        Client::builder("http://x").timeout(Duration::ZERO).build(),
        Client::builder("http://x").insert_max_params(0).build(),
        Client::builder("http://x").insert_max_bytes(0).build(),
        Client::builder("http://x")
            .retry(RetryPolicy::new().with_max_elapsed(Duration::ZERO))
            .build(),
    ];
    for result in cases {
        let err = result.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = server().await;
    respond_always(
        &server,
        ResponseTemplate::new(302).insert_header("location", "/elsewhere"),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let err = client.execute("DELETE FROM t").await.unwrap_err();
    assert_eq!((err.status(), err.is_retryable()), (Some(302), false));
    let err = client
        .query("SELECT 1")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert_eq!((err.status(), err.attempts()), (Some(302), 1));
    assert_eq!(hits(&server).await, 2, "no GET to the new location");
}

#[tokio::test]
async fn a_success_that_is_not_a_protocol_response_is_a_decode_error() {
    let server = server().await;
    respond_always(&server, ResponseTemplate::new(200).set_body_json(json!({}))).await;
    let client = builder(&server).build().unwrap();
    let err = client.execute("DELETE FROM t").await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode { .. }), "{err:?}");
    let err = client.query_table("SELECT 1").await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode { .. }), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn errors_after_a_retried_exchange_carry_its_attempts() {
    let server = server().await;
    respond_times(&server, error(503, "UNAVAILABLE", "busy"), 1).await;
    respond_times(&server, ok_rows(&["n"], &json!([["not a number"]])), 1).await;
    respond_times(&server, error(503, "UNAVAILABLE", "busy"), 1).await;
    respond_always(&server, ok_rows(&["n"], &json!([]))).await;
    let client = builder(&server).build().unwrap();
    let err = client
        .query("SELECT n")
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Decode { row: Some(0), .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 2);
    let err = client
        .query("SELECT n")
        .fetch_one::<i64>()
        .await
        .unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::RowNotFound, 2));
}

#[test]
fn credentials_in_the_base_url_are_refused_without_echoing_them() {
    let err = Client::builder("http://user:hunter2@127.0.0.1:8080")
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"));
    let builder = Client::builder("http://user:hunter2@127.0.0.1:8080");
    assert!(!format!("{builder:?}").contains("hunter2"));
    let err = Client::builder("http://[bad host:hunter2")
        .build()
        .unwrap_err();
    assert!(!format!("{err} {err:?}").contains("hunter2"));
}

#[test]
fn bound_values_stay_out_of_debug_output() {
    let client = Client::builder("http://127.0.0.1:9").build().unwrap();
    let query = client.query("SELECT ?").bind("param-secret");
    let text = format!("{query:?}");
    assert!(
        text.contains("SELECT ?") && !text.contains("param-secret"),
        "{text}"
    );
}
