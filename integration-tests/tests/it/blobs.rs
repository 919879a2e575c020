//! Binary data and compression end to end: blobs of 0 bytes and 1 MB round trip through
//! parameters, bulk inserts, typed rows and tables, at about 1.33 bytes on the wire per byte;
//! compressed and uncompressed responses decode to the same rows.

use serde::{Deserialize, Serialize};
use sqlhttp::{Blob, Client, Value};
use sqlhttp_server::Config;

use crate::harness::*;

/// A megabyte of bytes that do not compress away.
fn megabyte() -> Vec<u8> {
    let mut state: u32 = 0x9e37_79b9;
    (0..1_000_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct File {
    name: String,
    data: Blob,
}

#[tokio::test]
async fn blobs_of_0_bytes_and_1_mb_round_trip() {
    // A 1 MB blob is a 1.33 MB request body: over the default 1 MiB limit.
    let live = Live::with_config(Config {
        max_body_bytes: 4 << 20,
        ..Config::default()
    })
    .await;
    let client = live.builder().insert_max_bytes(4 << 20).build().unwrap();
    let table = unique_table("blobs");
    client
        .execute(format!(
            "CREATE TABLE \"{table}\" (name TEXT PRIMARY KEY, data BLOB NOT NULL)"
        ))
        .await
        .unwrap();
    let big = megabyte();
    client
        .execute(format!("INSERT INTO \"{table}\" VALUES (?, ?)"))
        .bind("empty")
        .bind(Blob(Vec::new()))
        .await
        .unwrap();
    client
        .insert(
            &table,
            &[File {
                name: "big".into(),
                data: Blob(big.clone()),
            }],
        )
        .await
        .unwrap();

    let files: Vec<File> = client
        .query(format!("SELECT name, data FROM \"{table}\" ORDER BY name"))
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(files[0].name, "big");
    assert!(files[0].data == Blob(big.clone()), "the megabyte came back");
    assert_eq!(files[1].data, Blob(Vec::new()));

    // A `Vec` target reads a row's cells; a blob cell in a one-tuple reads as its bytes.
    let (bytes,): (Vec<u8>,) = client
        .query(format!("SELECT data FROM \"{table}\" WHERE name = 'big'"))
        .fetch_one()
        .await
        .unwrap();
    assert!(bytes == big);
    let length: i64 = client
        .query(format!(
            "SELECT length(data) FROM \"{table}\" WHERE name = ?"
        ))
        .bind(Blob(Vec::new()))
        .fetch_optional()
        .await
        .unwrap()
        .unwrap_or(-1)
        .max(0);
    assert_eq!(length, 0, "a bound blob compares as a blob");
    let matched: i64 = client
        .query(format!("SELECT count(*) FROM \"{table}\" WHERE data = ?"))
        .bind(Blob(big.clone()))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(matched, 1);

    let table_result = client
        .query_table(format!("SELECT data FROM \"{table}\" ORDER BY name"))
        .await
        .unwrap();
    assert_eq!(
        table_result
            .row(0)
            .unwrap()
            .value("data")
            .and_then(Value::as_blob),
        Some(&big[..])
    );
    assert_eq!(
        table_result.row(1).unwrap().values(),
        [Value::Blob(Vec::new())]
    );

    // On the wire: base64, at most 1.4 bytes per byte.
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", live.url().trim_end_matches('/')))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"sql": "SELECT data FROM \"{table}\" WHERE name = 'big'"}}"#
        ))
        .send()
        .await
        .unwrap();
    let wire = response.bytes().await.unwrap().len();
    assert!(wire <= 1_400_000, "{wire} bytes for 1 MB");
}

#[tokio::test]
async fn compressed_and_uncompressed_responses_decode_equal() {
    let live = Live::start().await;
    // A blob of `x % 5` zero bytes, in each engine's words.
    let blob = match live.engine().await {
        Engine::Sqlite => "zeroblob(x % 5)",
        Engine::Postgres => "decode(repeat('00', x % 5), 'hex')",
    };
    let sql = format!(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30000) \
         SELECT x, 'row ' || x, CAST(x AS DOUBLE PRECISION) / 7, {blob}, NULL FROM c"
    );
    let sql = sql.as_str();
    type Row = (i64, String, f64, Blob, Option<String>);
    let with = |http: reqwest::ClientBuilder| -> Client {
        live.builder()
            .http_client(
                http.retry(reqwest::retry::never())
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    };
    let plain = with(reqwest::Client::builder().no_gzip().no_zstd());
    let gzip = with(reqwest::Client::builder().no_zstd());
    let zstd = with(reqwest::Client::builder().no_gzip());
    let expected: Vec<Row> = plain.query(sql).fetch_all().await.unwrap();
    assert_eq!(expected.len(), 30_000);
    for client in [&gzip, &zstd] {
        let all: Vec<Row> = client.query(sql).fetch_all().await.unwrap();
        if let Some(i) = (0..all.len()).find(|&i| all[i] != expected[i]) {
            panic!("row {i}: {:?} != {:?}", all[i], expected[i]);
        }
        assert_eq!(all.len(), expected.len());
        let mut streamed = Vec::new();
        let mut rows = client.query(sql).fetch::<Row>().await.unwrap();
        while let Some(row) = rows.try_next().await.unwrap() {
            streamed.push(row);
        }
        assert!(streamed == expected);
    }
}
