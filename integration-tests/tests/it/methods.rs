//! Every `Client` method against the live server, with real rows.

use serde::Deserialize;
use sqlhttp::{ErrorKind, Value};

use crate::harness::*;

#[tokio::test]
async fn ping_answers() {
    let live = Live::start().await;
    live.client().ping().await.unwrap();
}

#[tokio::test]
async fn inserted_rows_come_back_typed() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("typed");
    let rows = seed(&client, &table, 250).await;
    assert_eq!(
        all_rows(&client, &table).await,
        rows,
        "structs by column name, exact i64 and NULLs"
    );

    let pairs: Vec<(i64, Option<String>)> = client
        .query(format!(
            "SELECT id, note FROM \"{table}\" WHERE id >= ? ORDER BY id"
        ))
        .bind(i64::MAX - 2)
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(
        pairs,
        vec![
            (i64::MAX - 2, None),
            (i64::MAX - 1, None),
            (i64::MAX, Some("note 0".into()))
        ]
    );

    let one: Item = client
        .query(format!("SELECT * FROM \"{table}\" WHERE id = ?"))
        .bind(i64::MAX)
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(one, rows[rows.len() - 1]);
    let none: Option<Item> = client
        .query(format!("SELECT * FROM \"{table}\" WHERE id = ?"))
        .bind(0)
        .fetch_optional()
        .await
        .unwrap();
    assert_eq!(none, None);
    let err = client
        .query(format!("SELECT * FROM \"{table}\" WHERE id = 0"))
        .fetch_one::<Item>()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::RowNotFound);
    assert_eq!(count(&client, &table).await, 250);
}

#[tokio::test]
async fn query_table_reports_declared_types() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("table");
    seed(&client, &table, 3).await;
    let result = client
        .query_table(format!(
            "SELECT id, name, price, note, price * 2 AS doubled FROM \"{table}\" ORDER BY id"
        ))
        .await
        .unwrap();
    let columns: Vec<_> = result
        .columns()
        .iter()
        .map(|c| (c.name(), c.type_name()))
        .collect();
    // SQLite reports declared types (none for an expression); PostgreSQL the value's type.
    let expected = match live.engine().await {
        Engine::Sqlite => vec![
            ("id", "INTEGER"),
            ("name", "TEXT"),
            ("price", "REAL"),
            ("note", "TEXT"),
            ("doubled", ""),
        ],
        Engine::Postgres => vec![
            ("id", "int8"),
            ("name", "text"),
            ("price", "float8"),
            ("note", "text"),
            ("doubled", "float8"),
        ],
    };
    assert_eq!(columns, expected);
    assert_eq!(result.len(), 3);
    let last = result.row(2).unwrap();
    assert_eq!(last.get::<i64>("id").unwrap(), i64::MAX);
    assert_eq!(last.get::<f64>("doubled").unwrap(), 0.0);
    assert_eq!(last.value("note"), Some(&Value::Text("note 0".into())));
}

#[tokio::test]
async fn execute_reports_rows_affected_and_last_insert_id() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("exec");
    create(&client, &table, true).await;
    let effect = client
        .execute(format!(
            "INSERT INTO \"{table}\" (name, price) VALUES (?, ?)"
        ))
        .bind("a")
        .bind(1.5)
        .await
        .unwrap();
    assert_eq!(effect.rows_affected, 1);
    let id = match live.engine().await {
        Engine::Sqlite => effect.last_insert_id.expect("an insert reports its rowid"),
        // PostgreSQL has no rowid: RETURNING tells the id.
        Engine::Postgres => {
            assert_eq!(effect.last_insert_id, None);
            client
                .query(format!("SELECT max(id) FROM \"{table}\""))
                .fetch_one()
                .await
                .unwrap()
        }
    };
    let effect = client
        .execute(format!(
            "UPDATE \"{table}\" SET price = price + 1 WHERE id = ?"
        ))
        .bind(id)
        .await
        .unwrap();
    assert_eq!((effect.rows_affected, effect.last_insert_id), (1, None));
    let price: f64 = client
        .query(format!("SELECT price FROM \"{table}\" WHERE id = ?"))
        .bind(id)
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(price, 2.5);
}

#[tokio::test]
async fn parameters_are_bound_never_spliced() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("bound");
    create(&client, &table, true).await;
    let hostile = format!("x'); DROP TABLE \"{table}\"; --");
    client
        .execute(format!(
            "INSERT INTO \"{table}\" (name, price) VALUES (?, 0)"
        ))
        .bind(&hostile)
        .await
        .unwrap();
    #[derive(Deserialize)]
    struct Name {
        name: String,
    }
    let names: Vec<Name> = client
        .query(format!("SELECT name FROM \"{table}\""))
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(names[0].name, hostile);
}

#[tokio::test]
async fn a_large_insert_is_split_and_every_row_lands() {
    let live = Live::start().await;
    let client = live
        .builder()
        .insert_max_params(400)
        .insert_max_bytes(16 * 1024)
        .build()
        .unwrap();
    let table = unique_table("bulk");
    create(&client, &table, true).await;
    let mut rows = items(3_000);
    assert_eq!(client.insert(&table, &rows).await.unwrap(), 3_000);
    rows.sort_by_key(|item| item.id);
    assert_eq!(all_rows(&client, &table).await, rows);
}

#[tokio::test]
async fn a_bad_row_writes_nothing() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("atomic");
    create(&client, &table, true).await;
    let mut rows: Vec<serde_json::Value> = items(10)
        .into_iter()
        .map(|i| serde_json::to_value(i).unwrap())
        .collect();
    rows[9]["note"] = serde_json::json!({"nested": true});
    let err = client.insert(&table, &rows).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidParameter { .. }),
        "{err:?}"
    );
    assert_eq!(count(&client, &table).await, 0);
}

#[tokio::test]
async fn tables_and_describe_say_the_same_on_every_engine() {
    let live = Live::start().await;
    let client = live.client();
    let table = unique_table("described");
    let view = format!("{table}_v");
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, title TEXT NOT NULL, \
             year INTEGER DEFAULT 2000, note TEXT)"
        ))
        .await
        .unwrap();
    client
        .execute(format!(
            "CREATE VIEW \"{view}\" AS SELECT id, title FROM \"{table}\""
        ))
        .await
        .unwrap();
    let tables = client.tables().await.unwrap();
    let find = |name: &str| tables.iter().find(|t| t.name == name).cloned();
    assert!(!find(&table).unwrap().is_view, "{tables:?}");
    assert!(find(&view).unwrap().is_view, "{tables:?}");
    assert!(
        tables.iter().all(|t| !t.name.starts_with("_sqlhttp")),
        "the server's own tables are not the client's: {tables:?}"
    );

    let columns = client.describe(&table).await.unwrap().unwrap();
    let shape: Vec<_> = columns
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.declared_type.to_ascii_lowercase(),
                c.nullable,
                c.default.as_deref(),
                c.primary_key,
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("id", "integer".to_owned(), false, None, true),
            ("title", "text".to_owned(), false, None, false),
            ("year", "integer".to_owned(), true, Some("2000"), false),
            ("note", "text".to_owned(), true, None, false),
        ]
    );
    let view_columns = client.describe(&view).await.unwrap().unwrap();
    assert_eq!(
        view_columns
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["id", "title"]
    );
    assert_eq!(
        client.describe("no_such_table_anywhere").await.unwrap(),
        None
    );
    // A name as an unquoted identifier would be written finds the table on both engines.
    let loud = client.describe(&table.to_uppercase()).await.unwrap();
    assert_eq!(loud.map(|columns| columns.len()), Some(4));
    // The engine's own catalog is not the client's table (PostgreSQL's search path has it).
    for catalog in ["pg_class", "pg_roles", "sqlite_schema", "sqlite_master"] {
        assert_eq!(client.describe(catalog).await.unwrap(), None, "{catalog}");
    }
    assert_eq!(
        client.describe("_sqlhttp_idempotency").await.unwrap(),
        None,
        "the server's store is not described"
    );
}
