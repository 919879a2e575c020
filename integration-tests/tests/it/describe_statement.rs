//! `Client::describe_statement` against a live server on either engine: a statement's
//! parameters, columns and whether it may write, nothing run, and its refusals as the SDK's
//! typed errors.

use sqlhttp::ErrorKind;

use crate::harness::*;

#[tokio::test]
async fn a_statement_is_described_and_nothing_runs() {
    let live = Live::start().await;
    let client = live.client();
    let engine = live.engine().await;
    let table = unique_table("described_stmt");
    let id = match engine {
        Engine::Sqlite => "INTEGER PRIMARY KEY",
        Engine::Postgres => "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    };
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (id {id}, title TEXT NOT NULL, note TEXT)"
        ))
        .await
        .unwrap();
    let info = client
        .describe_statement(&format!(
            "SELECT id, title, note FROM \"{table}\" WHERE title = ?"
        ))
        .await
        .unwrap();
    let params: Vec<_> = info.params.iter().map(|p| p.type_name.as_deref()).collect();
    let expected_param = match engine {
        Engine::Sqlite => None,
        Engine::Postgres => Some("text"),
    };
    assert_eq!(params, [expected_param]);
    let columns: Vec<_> = info
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.nullable))
        .collect();
    assert_eq!(
        columns,
        [("id", Some(false)), ("title", Some(false)), ("note", None)]
    );
    assert!(!info.may_write);
    let named = match engine {
        Engine::Sqlite => "sqlite",
        Engine::Postgres => "postgresql",
    };
    assert_eq!(info.engine.as_deref(), Some(named));

    let insert = format!("INSERT INTO \"{table}\" (title) VALUES ('never')");
    let write = client.describe_statement(&insert).await.unwrap();
    assert!(write.may_write);
    assert!(write.columns.is_empty());
    let count: i64 = client
        .query(format!("SELECT count(*) FROM \"{table}\""))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(count, 0, "a described INSERT did not run");

    let missing = client
        .describe_statement("SELECT nothing FROM no_such_table_anywhere")
        .await
        .unwrap_err();
    assert!(
        matches!(missing.kind(), ErrorKind::Sql { .. }),
        "{missing:?}"
    );
}
