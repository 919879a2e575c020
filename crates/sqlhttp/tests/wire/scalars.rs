//! Scalars both ways through the public API: every documented shape a one-column result decodes
//! into, and the parameters that cannot be sent (NaN, the infinities, integers outside `i64`)
//! refused on every path that binds, before any request leaves.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlhttp::{Blob, Client, ErrorKind, Value};
use wiremock::ResponseTemplate;

use crate::support::*;

/// A one-column success body whose column is typed `BLOB`.
fn blob_rows(rows: &serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "columns": [{"name": "data", "type": "BLOB"}],
        "rows": rows,
        "rows_affected": 0,
        "last_insert_id": null,
    }))
}

#[tokio::test]
async fn a_one_column_blob_reads_back_as_every_bytes_shape() {
    let server = server().await;
    respond_always(&server, blob_rows(&json!([[{"base64": "AP8Q"}]]))).await;
    let client = builder(&server).build().unwrap();
    let query = || client.query("SELECT data FROM blobs WHERE id = 1");
    // The report of issue 37: this was a decode error.
    assert_eq!(query().fetch_one::<Blob>().await.unwrap().0, [0, 255, 16]);
    assert_eq!(
        query().fetch_one::<serde_bytes::ByteBuf>().await.unwrap(),
        [0, 255, 16]
    );
    assert_eq!(
        &query().fetch_one::<bytes::Bytes>().await.unwrap()[..],
        [0, 255, 16]
    );
    assert_eq!(
        query().fetch_one::<(Vec<u8>,)>().await.unwrap().0,
        [0, 255, 16]
    );
    assert_eq!(
        query().fetch_one::<Value>().await.unwrap(),
        Value::Blob(vec![0, 255, 16])
    );
    assert_eq!(
        query().fetch_one::<serde_json::Value>().await.unwrap(),
        json!({"base64": "AP8Q"})
    );
    assert_eq!(
        query().fetch_one::<Option<Blob>>().await.unwrap(),
        Some(Blob(vec![0, 255, 16]))
    );
    // A plain `Vec<u8>` target is a row of `u8` cells (as `Vec<i64>` is): the error says what to
    // use instead.
    let err = query().fetch_one::<Vec<u8>>().await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Decode { column: Some(c), .. } if c == "data"),
        "{err:?}"
    );
    assert!(err.to_string().contains("sqlhttp::Blob"), "{err}");
}

#[tokio::test]
async fn a_null_cell_is_none_in_every_option_shape() {
    let server = server().await;
    respond_always(&server, blob_rows(&json!([[null]]))).await;
    let client = builder(&server).build().unwrap();
    let query = || client.query("SELECT data FROM blobs");
    assert_eq!(query().fetch_one::<Option<Blob>>().await.unwrap(), None);
    assert_eq!(
        query()
            .fetch_one::<Option<serde_bytes::ByteBuf>>()
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        query().fetch_one::<Option<bytes::Bytes>>().await.unwrap(),
        None
    );
    assert_eq!(query().fetch_one::<Option<Value>>().await.unwrap(), None);
    assert_eq!(
        query()
            .fetch_one::<Option<serde_json::Value>>()
            .await
            .unwrap(),
        None
    );
    assert_eq!(query().fetch_one::<Value>().await.unwrap(), Value::Null);
    let err = query().fetch_one::<Blob>().await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Decode { .. }), "{err:?}");
}

#[derive(Serialize)]
struct Meters(f64);

#[derive(Serialize)]
struct Reading {
    sensor: &'static str,
    value: f64,
}

/// Binds `bad` as the second parameter (`?2`) on every path that binds one, and checks each call
/// fails with `InvalidParameter` naming it, and that the mock received nothing.
async fn refused_everywhere<T: Serialize + Clone>(bad: T, what: &str) {
    let server = server().await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).build().unwrap();
    let check = |err: sqlhttp::Error, path: &str| {
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidParameter { index: Some(1), .. }
            ),
            "{what} via {path}: {err:?}"
        );
        assert!(err.to_string().contains("?2"), "{what} via {path}: {err}");
        assert_eq!(err.attempts(), 0, "{what} via {path}");
    };
    let sql = "SELECT ?, ?";
    let err = client
        .query(sql)
        .bind(1)
        .bind(bad.clone())
        .fetch_all::<i64>()
        .await
        .unwrap_err();
    check(err, "query");
    let err = client
        .execute(sql)
        .bind(1)
        .bind(bad.clone())
        .await
        .unwrap_err();
    check(err, "execute");
    let err = client
        .query_table(sql)
        .bind(1)
        .bind(bad.clone())
        .await
        .unwrap_err();
    check(err, "query_table");
    let err = client
        .batch()
        .statement("SELECT 1")
        .statement(sql)
        .bind(1)
        .bind(bad.clone())
        .await
        .unwrap_err();
    check(err, "batch");
    assert_eq!(hits(&server).await, 0, "{what}: nothing may be sent");
}

#[tokio::test]
async fn non_finite_floats_and_out_of_range_integers_are_refused_before_sending() {
    refused_everywhere(f64::NAN, "f64 NaN").await;
    refused_everywhere(f64::INFINITY, "f64 +inf").await;
    refused_everywhere(f64::NEG_INFINITY, "f64 -inf").await;
    refused_everywhere(f32::NAN, "f32 NaN").await;
    refused_everywhere(f32::INFINITY, "f32 +inf").await;
    refused_everywhere(f32::NEG_INFINITY, "f32 -inf").await;
    refused_everywhere(Some(f64::NAN), "Some(NaN)").await;
    refused_everywhere(Value::Real(f64::INFINITY), "Value::Real(inf)").await;
    refused_everywhere(i64::MAX as u64 + 1, "u64 over i64::MAX").await;
    refused_everywhere(u64::MAX, "u64::MAX").await;
    refused_everywhere(u128::MAX, "u128::MAX").await;
    refused_everywhere(i128::from(i64::MIN) - 1, "i128 under i64::MIN").await;
    refused_everywhere(i128::from(i64::MAX) + 1, "i128 over i64::MAX").await;
}

#[tokio::test]
async fn a_non_finite_float_inside_a_value_or_an_insert_row_is_refused_before_sending() {
    let server = server().await;
    respond_always(&server, ok_effect(1, None)).await;
    let client = builder(&server).build().unwrap();
    // A newtype around a float binds as the float, and is refused as one.
    let err = client
        .execute("INSERT INTO t (m) VALUES (?)")
        .bind(Meters(f64::NAN))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidParameter { index: Some(0), .. }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("?1"), "{err}");
    // `insert` names the row and the field.
    let rows = [
        Reading {
            sensor: "a",
            value: 1.0,
        },
        Reading {
            sensor: "b",
            value: f64::NEG_INFINITY,
        },
    ];
    let err = client.insert("readings", &rows).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidParameter { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("row 1") && text.contains("`value`") && text.contains("infinity"),
        "{text}"
    );
    #[derive(Serialize)]
    struct Big {
        id: u64,
    }
    let err = client
        .insert("big", &[Big { id: u64::MAX }])
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidParameter { .. })
            && err.to_string().contains("`id`"),
        "{err:?}"
    );
    assert_eq!(hits(&server).await, 0, "nothing may be sent");
}

#[tokio::test]
async fn the_edges_that_fit_are_sent_as_themselves() {
    let server = server().await;
    respond_always(&server, ok_effect(1, None)).await;
    let client: Client = builder(&server).build().unwrap();
    client
        .execute("SELECT ?, ?, ?, ?, ?, ?, ?")
        .bind(i64::MAX as u64)
        .bind(i128::from(i64::MIN))
        .bind(f64::MAX)
        .bind(-0.0f64)
        .bind(f32::MIN_POSITIVE)
        .bind(None::<f64>)
        .bind(Value::Real(0.5))
        .await
        .unwrap();
    let requests = server.received_requests().await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(
        body["params"],
        json!([
            i64::MAX,
            i64::MIN,
            f64::MAX,
            -0.0,
            f64::from(f32::MIN_POSITIVE),
            null,
            0.5
        ])
    );
}

#[derive(Debug, Deserialize, PartialEq)]
struct Mixed {
    data: Option<Blob>,
    raw: bytes::Bytes,
    #[serde(with = "serde_bytes")]
    buf: Vec<u8>,
    plain: Vec<u8>,
    cell: Value,
    json: serde_json::Value,
}

#[tokio::test]
async fn structs_with_fields_of_every_shape_keep_decoding() {
    let server = server().await;
    let blob = json!({"base64": "AQI="});
    respond_always(
        &server,
        ok_rows(
            &["data", "raw", "buf", "plain", "cell", "json"],
            &json!([[null, blob, blob, blob, blob, {"k": [1, 2]}]]),
        ),
    )
    .await;
    let client = builder(&server).build().unwrap();
    let row: Mixed = client.query("SELECT ...").fetch_one().await.unwrap();
    assert_eq!(
        row,
        Mixed {
            data: None,
            raw: bytes::Bytes::from_static(&[1, 2]),
            buf: vec![1, 2],
            plain: vec![1, 2],
            cell: Value::Blob(vec![1, 2]),
            json: json!({"k": [1, 2]}),
        }
    );
}
