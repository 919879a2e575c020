//! Tests of `json_patch` and `jsonb_patch`: compared with SQLite's built-ins over generated
//! documents, and the linear time they exist for.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use proptest::prelude::*;
use rusqlite::Connection;
use rusqlite::types::Value;

use crate::engine::sqlite::control::Hooks;
use crate::engine::sqlite::functions::register;

/// A plain connection (SQLite's built-ins) and one with the replacements.
fn pair() -> (Connection, Connection) {
    let builtin = Connection::open_in_memory().unwrap();
    let replaced = Connection::open_in_memory().unwrap();
    let hooks = Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))));
    register(&replaced, &hooks).unwrap();
    (builtin, replaced)
}

/// The calls compared: the text and JSONB forms, the result's JSON subtype (an object
/// member is embedded, not quoted) and JSONB arguments. `jsonb_patch` is compared through
/// `json()`: its blob is the canonical JSONB of the result, where the built-in's keeps JSON5
/// number text and the header sizes of its edits (the same JSON, other bytes).
const CALLS: &[&str] = &[
    "json_patch(?1, ?2)",
    "typeof(jsonb_patch(?1, ?2))",
    "json_object('k', json_patch(?1, ?2))",
    "json_patch(jsonb(?1), ?2)",
    "json_patch(?1, jsonb(?2))",
    "json(jsonb_patch(?1, ?2))",
];

fn outcome(conn: &Connection, call: &str, args: &[Value]) -> Result<(Value, String), String> {
    let sql = format!("SELECT r, typeof(r) FROM (SELECT {call} AS r)");
    conn.prepare(&sql)
        .and_then(|mut stmt| {
            stmt.query_row(rusqlite::params_from_iter(args), |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
        })
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, m) => format!("{:?}: {m:?}", f.code),
            other => other.to_string(),
        })
}

fn same(builtin: &Connection, replaced: &Connection, args: &[Value]) {
    for call in CALLS {
        assert_eq!(
            outcome(replaced, call, args),
            outcome(builtin, call, args),
            "{call} with {args:?}"
        );
    }
}

/// Labels chosen to collide: the same characters spelled with and without escapes, a NUL
/// that ends SQLite's comparison, surrogate pairs and lone surrogates.
const LABELS: &[&str] = &[
    r#""a""#,
    r#""\u0061""#,
    r#""b""#,
    r#""ab""#,
    r#""a\u0000b""#,
    r#""a\u0000c""#,
    r#""é""#,
    r#""\u00e9""#,
    r#""😀""#,
    r#""\ud83d\ude00""#,
    r#""\ud83d""#,
    r#""\"""#,
    r#""\\""#,
    r#""\/""#,
    r#""/""#,
    r#""\n""#,
    r#""""#,
    "a",
    "'a'",
    r#""\x61""#,
];

const SCALARS: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-0",
    "1.0",
    "1e5",
    "1E+05",
    "0.10",
    "12345678901234567890",
    r#""x""#,
    r#""\u0041""#,
    r#""é""#,
    "[]",
    "[1,null,{}]",
    "'s'",
    "0x1F",
    "Infinity",
    "+1",
    ".5",
    "NaN",
];

fn json() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(SCALARS).prop_map(str::to_owned);
    leaf.prop_recursive(5, 40, 6, |inner| {
        prop_oneof![
            3 => prop::collection::vec(
                (prop::sample::select(LABELS), inner.clone(), any::<bool>()),
                0..6
            )
            .prop_map(|members| {
                let body: Vec<String> = members
                    .into_iter()
                    .map(|(label, value, spaced)| {
                        if spaced {
                            format!(" {label} : {value} ")
                        } else {
                            format!("{label}:{value}")
                        }
                    })
                    .collect();
                format!("{{{}}}", body.join(","))
            }),
            1 => prop::collection::vec(inner, 0..4)
                .prop_map(|items| format!("[{}]", items.join(","))),
        ]
    })
}

fn arg() -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => json().prop_map(Value::Text),
        1 => Just(Value::Null),
        1 => any::<i64>().prop_map(Value::Integer),
        1 => prop_oneof![Just(1.5), Just(-0.0), Just(1e300), Just(0.1)].prop_map(Value::Real),
        1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(Value::Blob),
        1 => json().prop_map(|j| Value::Text(format!("{j}}}"))),
        1 => json().prop_map(|j| Value::Text(format!("/* c */ {j} // c\n"))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn json_patch_matches_sqlite(target in arg(), patch in arg()) {
        let (builtin, replaced) = pair();
        same(&builtin, &replaced, &[target, patch]);
    }
}

#[test]
fn edge_cases_match_sqlite() {
    let (builtin, replaced) = pair();
    let text = |s: &str| Value::Text(s.to_owned());
    let deep = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    let cases: Vec<[Value; 2]> = vec![
        [text("{}"), text("{}")],
        [text(r#"{"a":1,"a":2}"#), text(r#"{"a":null}"#)],
        [
            text(r#"{"a":1,"a":2}"#),
            text(r#"{"a":null,"a":null,"a":3}"#),
        ],
        [
            text(r#"{"a":1}"#),
            text(r#"{"b":{"c":null,"d":{"e":null}},"b":{"x":1}}"#),
        ],
        [text(r#"{"a":1}"#), text("[1,2]")],
        [text("[1]"), text(r#"{"a":1}"#)],
        [text("bad"), Value::Null],
        [Value::Null, text("bad")],
        [text("{}"), text("bad")],
        [text(&deep(998)), text(&deep(998))],
        [text(&deep(999)), text(&deep(999))],
        [text(&deep(1000)), text(&deep(1000))],
        [text("{}"), text(&deep(999))],
        [text("{}"), text(&deep(1000))],
    ];
    // Nesting 1000 deep recurses 1000 times: an engine thread's stack (16 MiB), not a test
    // thread's default.
    std::thread::Builder::new()
        .stack_size(16 << 20)
        .spawn(move || {
            for args in cases {
                same(&builtin, &replaced, &args);
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// 200 000 distinct keys: SQLite's merge compares every patch key with every target key
/// (minutes); the replacement answers at once.
#[test]
fn many_keys_are_linear() {
    let (_, replaced) = pair();
    let object = |prefix: &str| {
        let members: Vec<String> = (0..200_000)
            .map(|i| format!(r#""{prefix}{i}":{i}"#))
            .collect();
        format!("{{{}}}", members.join(","))
    };
    let count: i64 = replaced
        .query_row(
            "SELECT count(*) FROM json_each(json_patch(?1, ?2))",
            [object("t"), object("p")],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(count, 400_000);
}
