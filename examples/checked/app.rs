//! The checked-query application's statements, the same text on both engines: each one checked
//! at compile time against the package's committed `.sqlhttp/` cache (its engine's types), then
//! run against a live server. Included by `sqlite/src/main.rs` and `postgres/src/main.rs`.

use sqlhttp::{Client, execute, query, query_as, query_scalar};

/// A row of `books`, filled by `query_as!` field by field.
#[derive(Debug, PartialEq)]
pub(crate) struct Book {
    pub(crate) id: i64,
    pub(crate) title: String,
    pub(crate) available: bool,
}

/// Runs every checked statement and checks what comes back.
pub(crate) async fn run(client: &Client) -> sqlhttp::Result<()> {
    for (title, year) in [("Dune", Some(1965)), ("Solaris", None)] {
        let added = execute!(
            "INSERT INTO checked_books (title, year) VALUES (?, ?)",
            title,
            year
        )
        .on(client)
        .await?;
        assert_eq!(added.rows_affected, 1);
    }
    // A generated struct: `id` and `title` are NOT NULL, `year` may be NULL.
    let dune = query!(
        "SELECT id, title, year FROM checked_books WHERE title = ?",
        "Dune"
    )
    .fetch_one(client)
    .await?;
    let (id, title, year): (i64, String, Option<i64>) = (dune.id, dune.title, dune.year);
    assert_eq!((title.as_str(), year), ("Dune", Some(1965)));

    // Your struct, and a transaction as the executor.
    let tx = client.transaction().await?;
    let books = query_as!(
        Book,
        "SELECT id, title, available FROM checked_books ORDER BY id"
    )
    .fetch_all(&tx)
    .await?;
    tx.commit().await?;
    assert_eq!(books.len(), 2);
    assert_eq!(
        books[0],
        Book {
            id,
            title: "Dune".to_owned(),
            available: true
        }
    );

    // One column, its type and nullability overridden in the SQL.
    let count = query_scalar!(r#"SELECT count(*) AS "n!: i64" FROM checked_books"#)
        .fetch_one(client)
        .await?;
    assert_eq!(count, 2);
    // A stream of the generated struct.
    let mut rows = query!("SELECT title FROM checked_books WHERE year IS NULL").fetch(client);
    let solaris = rows.try_next().await?.expect("a row");
    assert_eq!(solaris.title, "Solaris");
    println!("checked queries ran: {count} books, {}", books[1].title);
    Ok(())
}
