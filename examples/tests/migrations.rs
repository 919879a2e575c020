//! An application's test the way users write one: a fresh database per test from the testkit's
//! harness, with the application's migrations (`examples/migrations/`) and a fixture, a client
//! for it, and the chaos proxy one call away. Set `SQLHTTPD_TEST_POSTGRES_URL` to run the same
//! tests on PostgreSQL (a fresh database each, dropped after).

use serde::Deserialize;
use sqlhttp::ErrorKind;
use sqlhttp_testkit::{Fault, TestServer};

const MIGRATIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");

#[derive(Debug, Deserialize, PartialEq)]
struct Book {
    id: i64,
    title: String,
    isbn: Option<String>,
}

#[tokio::test]
async fn the_schema_comes_from_the_migrations_and_the_rows_from_the_fixture() {
    let server = TestServer::start()
        .migrations(MIGRATIONS)
        .fixture("INSERT INTO books (id, title, isbn) VALUES (1, 'Dune', '978-0441013593');")
        .postgres_from_env()
        .await;
    let client = server.client();
    let books: Vec<Book> = client
        .query("SELECT id, title, isbn FROM books ORDER BY id")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(
        books,
        [Book {
            id: 1,
            title: "Dune".into(),
            isbn: Some("978-0441013593".into())
        }]
    );
    // Migration 2's unique index is there.
    let duplicate = client
        .execute("INSERT INTO books (id, title, isbn) VALUES (2, 'Dune again', '978-0441013593')")
        .await
        .unwrap_err();
    assert!(
        matches!(duplicate.kind(), ErrorKind::ConstraintViolation { .. }),
        "{duplicate:?}"
    );
}

#[tokio::test]
async fn each_test_has_a_database_of_its_own() {
    // This test runs beside the one above; it sees none of its rows.
    let server = TestServer::start()
        .migrations(MIGRATIONS)
        .postgres_from_env()
        .await;
    let count: i64 = server
        .client()
        .query("SELECT count(*) FROM books")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn the_application_survives_a_lost_answer() {
    let server = TestServer::start()
        .migrations(MIGRATIONS)
        .postgres_from_env()
        .await;
    let proxy = server.proxy().await;
    let client = server.proxied_client(&proxy);
    // The insert reaches the server but its answer is lost; under its key the retry is
    // answered from the server's store, so the row is written once.
    proxy.push(Fault::DropAfterForward);
    let inserted = client
        .insert("books", &[serde_json::json!({"id": 7, "title": "Emma"})])
        .idempotency_key("add-emma")
        .retry_writes(true)
        .await
        .unwrap();
    assert_eq!(inserted, 1);
    assert_eq!(
        (proxy.requests(), proxy.forwarded()),
        (2, 2),
        "sent twice, applied once"
    );
    let count: i64 = server
        .client()
        .query("SELECT count(*) FROM books")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(count, 1);
}
