//! Every documented scalar shape, end to end on either engine: a one-column result read into
//! `Blob`, `serde_bytes::ByteBuf`, `bytes::Bytes`, a one-tuple `(Vec<u8>,)`, `sqlhttp::Value`,
//! `serde_json::Value`, the plain scalars and `Option`s of each (`NULL` as `None`), one table of
//! cases over one row of values and one of `NULL`s; PostgreSQL's `jsonb` and arrays too. And the
//! parameters that cannot be sent (NaN, the infinities, integers outside `i64`) refused with
//! nothing written.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use sqlhttp::{Blob, Client, ErrorKind, Value};

use crate::harness::*;

/// The table's one row of values (`id = 1`) and one of `NULL`s (`id = 2`), bound as parameters.
async fn create_rows(client: &Client, engine: Engine) -> String {
    let table = unique_table("scalars");
    let columns = match engine {
        Engine::Sqlite => {
            "id INTEGER PRIMARY KEY, data BLOB, n INTEGER, r REAL, s TEXT, flag INTEGER"
        }
        // `doc` and `arr` exist on PostgreSQL only: SQLite has no such cells.
        Engine::Postgres => {
            "id BIGINT PRIMARY KEY, data BYTEA, n BIGINT, r DOUBLE PRECISION, s TEXT, \
             flag BOOLEAN, doc JSONB, arr BIGINT[]"
        }
    };
    client
        .execute(format!("CREATE TABLE \"{table}\" ({columns})"))
        .await
        .unwrap();
    client
        .execute(format!(
            "INSERT INTO \"{table}\" (id, data, n, r, s, flag) VALUES (1, ?, ?, ?, ?, ?), \
             (2, NULL, NULL, NULL, NULL, NULL)"
        ))
        .bind(Blob(vec![0, 255, 16]))
        .bind(i64::MAX)
        .bind(1.5)
        .bind("héllo")
        .bind(true)
        .await
        .unwrap();
    if engine == Engine::Postgres {
        client
            .execute(format!(
                "UPDATE \"{table}\" SET doc = ?, arr = ? WHERE id = 1"
            ))
            .bind(r#"{"k": [1, 2]}"#)
            .bind("{1,2,3}")
            .await
            .unwrap();
    }
    table
}

/// `SELECT column FROM table WHERE id = ?` read as a `T`.
async fn one<T: DeserializeOwned + Send>(
    client: &Client,
    table: &str,
    column: &str,
    id: i64,
) -> sqlhttp::Result<T> {
    client
        .query(format!("SELECT {column} FROM \"{table}\" WHERE id = ?"))
        .bind(id)
        .fetch_one()
        .await
}

/// One case of the table: the column of row `id` read as `$ty` is `$want`.
macro_rules! case {
    ($client:expr, $table:expr, $engine:expr, $column:literal, $id:literal, $ty:ty, $want:expr) => {{
        let got: $ty = one(&$client, &$table, $column, $id)
            .await
            .unwrap_or_else(|err| {
                panic!(
                    "{:?}: {} of row {} as {}: {err}",
                    $engine,
                    $column,
                    $id,
                    stringify!($ty)
                )
            });
        let want: $ty = $want;
        assert_eq!(
            got,
            want,
            "{:?}: {} of row {} as {}",
            $engine,
            $column,
            $id,
            stringify!($ty)
        );
    }};
}

#[tokio::test]
async fn every_scalar_shape_reads_a_one_column_result() {
    let live = Live::start().await;
    let client = live.client();
    let engine = live.engine().await;
    let table = create_rows(&client, engine).await;
    let bytes = vec![0u8, 255, 16];
    let (c, t, e) = (&client, &table, engine);

    // A BLOB (`bytea`) in every bytes shape, and `NULL` as `None` in each.
    case!(c, t, e, "data", 1, Blob, Blob(bytes.clone()));
    case!(
        c,
        t,
        e,
        "data",
        1,
        serde_bytes::ByteBuf,
        serde_bytes::ByteBuf::from(bytes.clone())
    );
    case!(
        c,
        t,
        e,
        "data",
        1,
        bytes::Bytes,
        bytes::Bytes::from(bytes.clone())
    );
    case!(c, t, e, "data", 1, (Vec<u8>,), (bytes.clone(),));
    case!(c, t, e, "data", 1, Value, Value::Blob(bytes.clone()));
    case!(
        c,
        t,
        e,
        "data",
        1,
        serde_json::Value,
        json!({"base64": "AP8Q"})
    );
    case!(c, t, e, "data", 1, Option<Blob>, Some(Blob(bytes.clone())));
    case!(c, t, e, "data", 2, Option<Blob>, None);
    case!(c, t, e, "data", 2, Option<serde_bytes::ByteBuf>, None);
    case!(c, t, e, "data", 2, Option<bytes::Bytes>, None);
    case!(c, t, e, "data", 2, (Option<Vec<u8>>,), (None,));
    case!(c, t, e, "data", 2, Option<Value>, None);
    case!(c, t, e, "data", 2, Option<serde_json::Value>, None);
    case!(c, t, e, "data", 2, Value, Value::Null);

    // The plain scalars.
    case!(c, t, e, "n", 1, i64, i64::MAX);
    case!(c, t, e, "n", 1, Value, Value::Integer(i64::MAX));
    case!(c, t, e, "n", 1, serde_json::Value, json!(i64::MAX));
    case!(c, t, e, "n", 2, Option<i64>, None);
    case!(c, t, e, "r", 1, f64, 1.5);
    case!(c, t, e, "r", 1, Value, Value::Real(1.5));
    case!(c, t, e, "r", 1, serde_json::Value, json!(1.5));
    case!(c, t, e, "r", 2, Option<f64>, None);
    case!(c, t, e, "s", 1, String, "héllo".to_owned());
    case!(c, t, e, "s", 1, Value, Value::Text("héllo".into()));
    case!(c, t, e, "s", 1, serde_json::Value, json!("héllo"));
    case!(c, t, e, "s", 2, Option<String>, None);
    // A bool is SQLite's 1 and PostgreSQL's `true`.
    case!(c, t, e, "flag", 1, bool, true);
    case!(c, t, e, "flag", 1, Option<bool>, Some(true));
    case!(c, t, e, "flag", 2, Option<bool>, None);
    case!(c, t, e, "NOT flag", 1, bool, false);

    if engine == Engine::Postgres {
        // `jsonb` is the JSON value itself; an array is a JSON array (`Value::Json`, never bytes).
        let doc = json!({"k": [1, 2]});
        case!(c, t, e, "doc", 1, serde_json::Value, doc.clone());
        case!(c, t, e, "doc", 1, Value, Value::Json(doc.clone()));
        case!(
            c,
            t,
            e,
            "doc",
            1,
            Option<serde_json::Value>,
            Some(doc.clone())
        );
        case!(c, t, e, "doc", 2, Option<serde_json::Value>, None);
        case!(c, t, e, "arr", 1, (Vec<i64>,), (vec![1, 2, 3],));
        case!(c, t, e, "arr", 1, serde_json::Value, json!([1, 2, 3]));
        case!(c, t, e, "arr", 1, Value, Value::Json(json!([1, 2, 3])));
        case!(c, t, e, "arr", 2, (Option<Vec<i64>>,), (None,));
    }

    // A plain `Vec<u8>` is a row of `u8` cells, as `Vec<i64>` is: refused, saying what to use.
    let err = one::<Vec<u8>>(c, t, "data", 1).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Decode { .. }) && err.to_string().contains("sqlhttp::Blob"),
        "{engine:?}: {err}"
    );
}

#[derive(Debug, Deserialize, PartialEq)]
struct Row {
    data: Option<Blob>,
    #[serde(with = "serde_bytes")]
    raw: Option<Vec<u8>>,
    n: Option<i64>,
    r: Option<f64>,
    s: Option<String>,
    flag: Option<bool>,
    cell: Value,
}

#[tokio::test]
async fn rows_of_every_shape_read_by_name_and_as_tables() {
    let live = Live::start().await;
    let client = live.client();
    let engine = live.engine().await;
    let table = create_rows(&client, engine).await;
    let sql = format!(
        "SELECT data, data AS raw, n, r, s, flag, data AS cell FROM \"{table}\" ORDER BY id"
    );
    let rows: Vec<Row> = client.query(&sql).fetch_all().await.unwrap();
    assert_eq!(
        rows,
        [
            Row {
                data: Some(Blob(vec![0, 255, 16])),
                raw: Some(vec![0, 255, 16]),
                n: Some(i64::MAX),
                r: Some(1.5),
                s: Some("héllo".into()),
                flag: Some(true),
                cell: Value::Blob(vec![0, 255, 16]),
            },
            Row {
                data: None,
                raw: None,
                n: None,
                r: None,
                s: None,
                flag: None,
                cell: Value::Null,
            },
        ],
        "{engine:?}"
    );
    let tables = client.query_table(&sql).await.unwrap();
    assert_eq!(tables.rows_as::<Row>().unwrap(), rows, "{engine:?}");
    let first = tables.row(0).unwrap();
    assert_eq!(first.get::<Blob>("data").unwrap().0, [0, 255, 16]);
    assert_eq!(&first.get::<bytes::Bytes>("raw").unwrap()[..], [0, 255, 16]);
    assert!(first.get::<bool>("flag").unwrap(), "{engine:?}");
    if engine == Engine::Postgres {
        let table = client
            .query_table(format!("SELECT doc, arr FROM \"{table}\" ORDER BY id"))
            .await
            .unwrap();
        assert_eq!(
            table.row(0).unwrap().values(),
            [
                Value::Json(json!({"k": [1, 2]})),
                Value::Json(json!([1, 2, 3]))
            ]
        );
        assert_eq!(
            table.row(0).unwrap().get::<Vec<i64>>("arr").unwrap(),
            [1, 2, 3]
        );
        assert_eq!(table.row(1).unwrap().values(), [Value::Null, Value::Null]);
    }
}

#[tokio::test]
async fn parameters_that_cannot_be_sent_write_nothing() {
    let live = Live::start().await;
    let client = live.client();
    let engine = live.engine().await;
    let table = create_rows(&client, engine).await;
    let insert = format!("INSERT INTO \"{table}\" (id, r) VALUES (?, ?)");
    for (what, err) in [
        ("NaN", client.execute(&insert).bind(3).bind(f64::NAN).await),
        (
            "+inf",
            client.execute(&insert).bind(3).bind(f32::INFINITY).await,
        ),
        (
            "-inf",
            client
                .execute(&insert)
                .bind(3)
                .bind(f64::NEG_INFINITY)
                .await,
        ),
        (
            "u64 over i64::MAX",
            client.execute(&insert).bind(1u64 << 63).bind(1.0).await,
        ),
    ] {
        let err = err.unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::InvalidParameter { .. }),
            "{engine:?} {what}: {err:?}"
        );
    }
    #[derive(serde::Serialize)]
    struct New {
        id: i64,
        r: f64,
    }
    let err = client
        .insert(&table, &[New { id: 3, r: 1.0 }, New { id: 4, r: f64::NAN }])
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidParameter { .. }),
        "{engine:?}: {err:?}"
    );
    // Inside a transaction too: the refused statements are never sent (a NaN sent as NULL would
    // insert row 3 and commit with it), and the transaction goes on.
    let tx = client.transaction().await.unwrap();
    let err = tx
        .execute(&insert)
        .bind(3)
        .bind(f64::NAN)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidParameter { index: Some(1), .. }
        ),
        "{engine:?}: {err:?}"
    );
    let err = tx
        .insert(
            &table,
            &[New {
                id: 3,
                r: f64::INFINITY,
            }],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidParameter { .. }),
        "{engine:?}: {err:?}"
    );
    tx.execute(&insert).bind(5).bind(2.5).await.unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<i64> = client
        .query(format!("SELECT id FROM \"{table}\" ORDER BY id"))
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(
        ids,
        [1, 2, 5],
        "{engine:?}: only the valid statement was written"
    );
}
