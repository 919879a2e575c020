//! Typed decode of a 100,000-row, 8-column response, side by side with what a user would write instead.
//!
//! Three ways over the same bytes:
//! * `sqlhttp` — `sqlhttp::decode::rows::<Row>`: structs by column name, straight from the bytes;
//! * `via_value` — parse into `serde_json::Value`, then build each row's object and convert it
//!   (the generic code a user writes without this SDK);
//! * `floor` — serde_json's own typed parse into tuples (no names, no checks): the floor.
//!
//! Run: `cargo bench -p sqlhttp --bench decode`. Criterion prints each variant's throughput; the
//! summary at the end prints rows/s and the ratios, measured in this same process.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use serde::Deserialize;
use serde_json::{Map, Value, json};

const ROWS: usize = 100_000;

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Row {
    id: i64,
    name: String,
    email: String,
    score: f64,
    active: bool,
    age: Option<i64>,
    created_at: String,
    note: Option<String>,
}

type Tuple = (
    i64,
    String,
    String,
    f64,
    bool,
    Option<i64>,
    String,
    Option<String>,
);

#[derive(Deserialize)]
struct TupleEnvelope {
    rows: Vec<Tuple>,
}

const COLUMNS: [(&str, &str); 8] = [
    ("id", "INTEGER"),
    ("name", "TEXT"),
    ("email", "TEXT"),
    ("score", "REAL"),
    ("active", "INTEGER"),
    ("age", "INTEGER"),
    ("created_at", "TEXT"),
    ("note", "TEXT"),
];

fn body() -> Vec<u8> {
    let rows: Vec<Value> = (0..ROWS as i64)
        .map(|i| {
            json!([
                i * 7_919,
                format!("user {i}"),
                format!("user{i}@example.com"),
                i as f64 / 7.0,
                i % 3 == 0,
                if i % 5 == 0 {
                    Value::Null
                } else {
                    json!(18 + i % 60)
                },
                "2026-11-29T12:00:00Z",
                if i % 2 == 0 {
                    Value::Null
                } else {
                    json!("a short note")
                },
            ])
        })
        .collect();
    let columns: Vec<Value> = COLUMNS
        .iter()
        .map(|(n, t)| json!({"name": n, "type": t}))
        .collect();
    serde_json::to_vec(
        &json!({"columns": columns, "rows": rows, "rows_affected": 0, "last_insert_id": null}),
    )
    .unwrap()
}

fn sqlhttp_typed(body: &[u8]) -> Vec<Row> {
    sqlhttp::decode::rows::<Row>(body).unwrap()
}

fn via_value(body: &[u8]) -> Vec<Row> {
    let mut value: Value = serde_json::from_slice(body).unwrap();
    let names: Vec<String> = value["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    let Value::Array(rows) = value["rows"].take() else {
        panic!("rows")
    };
    rows.into_iter()
        .map(|row| {
            let Value::Array(cells) = row else {
                panic!("row")
            };
            let object: Map<String, Value> = names.iter().cloned().zip(cells).collect();
            serde_json::from_value(Value::Object(object)).unwrap()
        })
        .collect()
}

fn floor(body: &[u8]) -> Vec<Tuple> {
    serde_json::from_slice::<TupleEnvelope>(body).unwrap().rows
}

fn bench(c: &mut Criterion, body: &[u8]) {
    let mut group = c.benchmark_group("decode_100k_rows_8_cols");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.bench_function("sqlhttp", |b| {
        b.iter(|| black_box(sqlhttp_typed(black_box(body))))
    });
    group.bench_function("via_value", |b| {
        b.iter(|| black_box(via_value(black_box(body))))
    });
    group.bench_function("floor", |b| b.iter(|| black_box(floor(black_box(body)))));
    group.finish();
}

/// One timing of `f`.
fn time<T>(f: impl Fn() -> T) -> Duration {
    let started = Instant::now();
    black_box(f());
    started.elapsed()
}

fn summary(body: &[u8]) {
    // Interleaved, so a machine busy with other work slows every variant alike; best of each.
    let runs = 15;
    let (mut typed, mut value, mut floor_) = (Duration::MAX, Duration::MAX, Duration::MAX);
    for _ in 0..runs {
        typed = typed.min(time(|| sqlhttp_typed(body)));
        value = value.min(time(|| via_value(body)));
        floor_ = floor_.min(time(|| floor(body)));
    }
    let floor = floor_;
    let rate = |d: Duration| ROWS as f64 / d.as_secs_f64();
    println!(
        "\nsummary ({ROWS} rows x 8 columns, {} bytes, best of {runs}):",
        body.len()
    );
    println!("  sqlhttp typed decode   {:>12.0} rows/s", rate(typed));
    println!("  via serde_json::Value  {:>12.0} rows/s", rate(value));
    println!(
        "  serde_json tuples      {:>12.0} rows/s  (floor)",
        rate(floor)
    );
    println!(
        "  sqlhttp is {:.2}x the Value path and {:.2}x the floor's speed",
        value.as_secs_f64() / typed.as_secs_f64(),
        floor.as_secs_f64() / typed.as_secs_f64()
    );
}

fn main() {
    let body = body();
    assert_eq!(sqlhttp_typed(&body).len(), ROWS);
    assert_eq!(via_value(&body).len(), ROWS);
    assert_eq!(floor(&body).len(), ROWS);
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion, &body);
    criterion.final_summary();
    summary(&body);
}
