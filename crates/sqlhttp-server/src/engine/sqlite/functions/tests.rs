//! Differential tests of the replacements: each compared with SQLite's built-in on a plain
//! connection, over generated and edge-case inputs, plus the bounds they exist for (linear
//! time, a stop when the job must).

use super::*;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use proptest::prelude::*;
use rusqlite::types::Value;

use crate::engine::sqlite::control::JobControl;

fn idle_hooks() -> Arc<Hooks> {
    Arc::new(Hooks::new(Arc::new(AtomicBool::new(false))))
}

/// A plain connection (SQLite's built-ins) and one with the replacements.
fn pair() -> (Connection, Connection) {
    let builtin = Connection::open_in_memory().unwrap();
    let replaced = Connection::open_in_memory().unwrap();
    register(&replaced, &idle_hooks()).unwrap();
    (builtin, replaced)
}

/// [`pair`] with tiny value and LIKE-pattern limits, so inputs reach them.
fn limited_pair() -> (Connection, Connection) {
    let builtin = Connection::open_in_memory().unwrap();
    let replaced = Connection::open_in_memory().unwrap();
    for conn in [&builtin, &replaced] {
        conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, 24).unwrap();
        conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 6)
            .unwrap();
    }
    register(&replaced, &idle_hooks()).unwrap();
    (builtin, replaced)
}

/// One argument: a bound value, or text made of any bytes (`CAST(blob AS TEXT)`).
#[derive(Debug, Clone)]
enum Arg {
    Value(Value),
    RawText(Vec<u8>),
}

/// The result of `sql` with `args` as `?1..`, or the error's code and message.
fn outcome(conn: &Connection, sql: &str, args: &[Arg]) -> Result<Value, String> {
    let params: Vec<Value> = args
        .iter()
        .map(|arg| match arg {
            Arg::Value(v) => v.clone(),
            Arg::RawText(bytes) => Value::Blob(bytes.clone()),
        })
        .collect();
    conn.prepare(sql)
        .and_then(|mut stmt| {
            stmt.query_row(rusqlite::params_from_iter(params), |row| {
                let value: Value = row.get(0)?;
                let kind: String = row.get(1)?;
                Ok((value, kind))
            })
        })
        .map(|(value, kind)| match value {
            // Text with invalid UTF-8 comes back as bytes: compare bytes and type.
            Value::Blob(b) => Value::Text(format!("{kind}:{b:?}")),
            other => other,
        })
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, m) => format!("{:?}: {m:?}", f.code),
            other => other.to_string(),
        })
}

/// `call` (a function call over `?1..?n`) on both connections.
fn same(builtin: &Connection, replaced: &Connection, call: &str, args: &[Arg]) {
    let mut call = call.to_owned();
    for (i, arg) in args.iter().enumerate().rev() {
        if let Arg::RawText(_) = arg {
            call = call.replace(&format!("?{}", i + 1), &format!("CAST(?{} AS TEXT)", i + 1));
        }
    }
    // The raw bytes and type of the result, whatever its encoding.
    let sql = format!(
        "SELECT CASE typeof(r) WHEN 'text' THEN CAST(r AS BLOB) ELSE r END, typeof(r) \
         FROM (SELECT {call} AS r)"
    );
    assert_eq!(
        outcome(replaced, &sql, args),
        outcome(builtin, &sql, args),
        "{call} with {args:?}"
    );
}

const PIECES: &[&str] = &[
    "a", "A", "b", "B", "z", "Z", " ", "%", "_", "*", "?", "[", "]", "^", "-", "\\", "x", "é", "É",
    "€", "😀", "\u{0}", "\u{fffd}", "ab", "aa", "1", "0", ".",
];
const RAW_PIECES: &[&[u8]] = &[
    b"\x80",
    b"\xbf",
    b"\xc0",
    b"\xc3",
    b"\xc3\xa9",
    b"\xe2\x82",
    b"\xf0\x9f",
    b"\xff",
    b"\xed\xa0\x80",
    b"\xc0\x80",
    b"\xf8\x88\x80\x80\x80",
    b"a",
    b"%",
    b"\x00",
];

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..12).prop_map(|p| p.concat())
}

fn raw() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(RAW_PIECES), 0..10).prop_map(|p| p.concat())
}

fn arg() -> impl Strategy<Value = Arg> {
    prop_oneof![
        1 => Just(Arg::Value(Value::Null)),
        6 => text().prop_map(|t| Arg::Value(Value::Text(t))),
        2 => raw().prop_map(|b| Arg::Value(Value::Blob(b))),
        3 => raw().prop_map(Arg::RawText),
        1 => prop_oneof![Just(0i64), Just(-1), Just(10), Just(101), any::<i64>()]
            .prop_map(|i| Arg::Value(Value::Integer(i))),
        1 => prop_oneof![
            Just(0.0f64), Just(-0.0), Just(1.0), Just(0.1), Just(-2.5), Just(1e15),
            Just(1e300), Just(f64::INFINITY), Just(f64::NEG_INFINITY), Just(123456789.0),
            any::<f64>().prop_filter("NaN is NULL", |f| !f.is_nan()),
        ]
        .prop_map(|r| Arg::Value(Value::Real(r))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn two_argument_functions_match_sqlite(a in arg(), b in arg(), limited: bool) {
        let (builtin, replaced) = if limited { limited_pair() } else { pair() };
        for call in [
            "instr(?1, ?2)", "trim(?1, ?2)", "ltrim(?1, ?2)", "rtrim(?1, ?2)",
            "unhex(?1, ?2)", "like(?1, ?2)", "glob(?1, ?2)", "?2 LIKE ?1", "?2 GLOB ?1",
            "?2 NOT LIKE ?1",
        ] {
            same(&builtin, &replaced, call, &[a.clone(), b.clone()]);
        }
        for call in ["trim(?1)", "ltrim(?1)", "rtrim(?1)"] {
            same(&builtin, &replaced, call, std::slice::from_ref(&a));
        }
    }

    #[test]
    fn three_argument_functions_match_sqlite(
        a in arg(), b in arg(), c in arg(), limited: bool
    ) {
        let (builtin, replaced) = if limited { limited_pair() } else { pair() };
        for call in ["replace(?1, ?2, ?3)", "like(?1, ?2, ?3)", "?2 LIKE ?1 ESCAPE ?3"] {
            same(&builtin, &replaced, call, &[a.clone(), b.clone(), c.clone()]);
        }
    }

    #[test]
    fn like_and_glob_patterns_match_sqlite(
        pattern in prop::collection::vec(
            prop::sample::select(&["%", "_", "*", "?", "[", "]", "^", "-", "a", "A", "b",
                "é", "\\", "[a-c]", "[^a]", "[^é]", "[]]", "\\%", "\\_"][..]), 0..6)
            .prop_map(|p| p.concat()),
        string in prop::collection::vec(
            prop::sample::select(&["a", "A", "b", "B", "c", "é", "É", "%", "_", "]", "-",
                "\\", "*", "?"][..]), 0..6)
            .prop_map(|p| p.concat()),
        escape in prop::sample::select(&["\\", "%", "_", "a", "é", "[", "*"][..]),
    ) {
        let (builtin, replaced) = pair();
        let args = [
            Arg::Value(Value::Text(pattern)),
            Arg::Value(Value::Text(string)),
            Arg::Value(Value::Text(escape.to_owned())),
        ];
        for call in ["like(?1, ?2)", "glob(?1, ?2)", "like(?1, ?2, ?3)"] {
            same(&builtin, &replaced, call, &args);
        }
    }

    #[test]
    fn trim_sets_with_shared_prefixes_match_sqlite(
        input in raw(), set in raw(), extra in text()
    ) {
        let (builtin, replaced) = pair();
        let mut input = input;
        input.extend_from_slice(extra.as_bytes());
        for call in ["trim(?1, ?2)", "ltrim(?1, ?2)", "rtrim(?1, ?2)", "instr(?1, ?2)",
                     "replace(?1, ?2, 'é')", "unhex(?1, ?2)"] {
            same(&builtin, &replaced, call,
                 &[Arg::RawText(input.clone()), Arg::RawText(set.clone())]);
        }
    }
}

#[test]
fn edge_cases_match_sqlite() {
    let (builtin, replaced) = pair();
    let t = |s: &str| Arg::Value(Value::Text(s.to_owned()));
    let b = |s: &[u8]| Arg::Value(Value::Blob(s.to_vec()));
    let cases: Vec<(&str, Vec<Arg>)> = vec![
        ("instr(?1, ?2)", vec![t("héllo wörld"), t("wö")]),
        ("instr(?1, ?2)", vec![b(b"\x00\x01\x02\x01"), b(b"\x01")]),
        ("instr(?1, ?2)", vec![b(b"h\xc3\xa9llo"), t("llo")]),
        ("instr(?1, ?2)", vec![t(""), t("")]),
        (
            "instr(?1, ?2)",
            vec![Arg::Value(Value::Real(12.5)), t(".5")],
        ),
        (
            "instr(?1, ?2)",
            vec![Arg::Value(Value::Integer(-1234)), t("34")],
        ),
        ("replace(?1, ?2, ?3)", vec![t("aaaa"), t("aa"), t("b")]),
        (
            "replace(?1, ?2, ?3)",
            vec![t("abc"), t(""), Arg::Value(Value::Null)],
        ),
        ("replace(?1, ?2, ?3)", vec![t("abc"), b(b"\x00b"), t("x")]),
        (
            "replace(?1, ?2, ?3)",
            vec![b(b"\x01\x02"), b(b"\x02"), b(b"\x03")],
        ),
        ("trim(?1, ?2)", vec![t("xxhixx"), t("x")]),
        ("trim(?1, ?2)", vec![t("éaé"), t("é")]),
        ("rtrim(?1, ?2)", vec![t("abc"), t("")]),
        ("ltrim(?1, ?2)", vec![t("abc"), t("a\u{0}b")]),
        ("unhex(?1, ?2)", vec![t("01 02-03"), t(" -")]),
        ("unhex(?1, ?2)", vec![t("0"), t("")]),
        ("unhex(?1, ?2)", vec![t("€01"), t("€")]),
        ("like(?1, ?2, ?3)", vec![t("a%"), t("abc"), t("")]),
        ("like(?1, ?2, ?3)", vec![t("a%"), t("abc"), t("ab")]),
        ("like(?1, ?2, ?3)", vec![t("a%"), t("a%"), t("%")]),
        ("like(?1, ?2)", vec![t("%É%"), t("xéx")]),
        ("like(?1, ?2)", vec![t("%B%"), t("abc")]),
        ("glob(?1, ?2)", vec![t("*[b-d]?"), t("xxcz")]),
        ("glob(?1, ?2)", vec![t("[]a]*"), t("]zz")]),
        ("glob(?1, ?2)", vec![t("[a-c]"), t("a")]),
        ("glob(?1, ?2)", vec![t("[a-c]"), t("c")]),
        ("glob(?1, ?2)", vec![t("[^a-c]"), t("d")]),
        ("glob(?1, ?2)", vec![t("[a-]"), t("-")]),
        ("glob(?1, ?2)", vec![t("*[^é]"), t("é")]),
        ("glob(?1, ?2)", vec![t("*[^é]x"), t("éaéx")]),
        ("like(?1, ?2, ?3)", vec![t("a\\_"), t("ab"), t("\\")]),
        ("like(?1, ?2, ?3)", vec![t("a\\_"), t("a_"), t("\\")]),
        ("like(?1, ?2, ?3)", vec![t("a\\%"), t("abc"), t("\\")]),
        ("like(?1, ?2, ?3)", vec![t("%\\%"), t("50%"), t("\\")]),
    ];
    for (call, args) in &cases {
        same(&builtin, &replaced, call, args);
    }
    // Many wildcards: SQLite recurses once per wildcard, the port keeps one search position.
    for wildcard in ["%a", "*a", "%_", "*?", "*[a]", "%\\%"] {
        let pattern = format!("{}b", wildcard.repeat(1500));
        for string in ["a".repeat(4000), format!("{}b", "a".repeat(4000))] {
            for call in ["like(?1, ?2)", "glob(?1, ?2)", "like(?1, ?2, '\\')"] {
                same(&builtin, &replaced, call, &[t(&pattern), t(&string)]);
            }
        }
    }
    // Past the pattern limit, and past the value limit.
    let (builtin_limited, replaced_limited) = {
        let builtin = Connection::open_in_memory().unwrap();
        let replaced = Connection::open_in_memory().unwrap();
        for conn in [&builtin, &replaced] {
            conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 4)
                .unwrap();
            conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, 100).unwrap();
        }
        register(&replaced, &idle_hooks()).unwrap();
        (builtin, replaced)
    };
    drop((builtin, replaced));
    for (call, args) in [
        ("like(?1, ?2)", vec![t("%aaaa"), Arg::Value(Value::Null)]),
        ("glob(?1, ?2)", vec![t("*aaa"), t("aaa")]),
        (
            "replace(?1, ?2, ?3)",
            vec![t(&format!("a{}", "c".repeat(98))), t("a"), t("bb")],
        ),
        (
            "replace(?1, ?2, ?3)",
            vec![t(&format!("a{}", "c".repeat(99))), t("a"), t("bb")],
        ),
        (
            "replace(?1, ?2, ?3)",
            vec![t(&"a".repeat(100)), t("a"), t("b")],
        ),
        (
            "replace(?1, ?2, ?3)",
            vec![t(&"a".repeat(99)), t("a"), t("b")],
        ),
        (
            "replace(?1, ?2, ?3)",
            vec![t(&"a".repeat(100)), t(""), t("b")],
        ),
        ("trim(?1, ?2)", vec![t("abc"), t("abcdefghi")]),
        ("trim(?1, ?2)", vec![t("abc"), t("abcdefgh")]),
        ("trim(?1)", vec![t(&" ".repeat(100))]),
        ("unhex(?1, ?2)", vec![t(&"ab".repeat(50)), t(" ")]),
    ] {
        same(&builtin_limited, &replaced_limited, call, &args);
    }
}

#[test]
fn the_finding_is_linear() {
    let (_, replaced) = pair();
    let started = std::time::Instant::now();
    let found: i64 = replaced
        .query_row(
            "SELECT instr(zeroblob(2*?1), zeroblob(?1)||x'01') + \
             length(replace(printf('%.*c', 2*?1, 'a'), printf('%.*c', ?1, 'a')||'b', 'x')) + \
             length(trim(printf('%.*c', ?1, 'a'), printf('%.*c', ?1, 'b')||'a')) + \
             length(unhex(printf('%.*c', ?1, ' '), printf('%.*c', ?1, 'x')||' '))",
            [1 << 20],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(found, 2 << 20);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_long_match_stops_when_the_job_must() {
    let hooks = idle_hooks();
    let conn = Connection::open_in_memory().unwrap();
    register(&conn, &hooks).unwrap();
    let job = Arc::new(JobControl::default());
    job.start(Duration::ZERO);
    hooks.begin_job(Arc::clone(&job));
    let err = conn
        .query_row(
            "SELECT printf('%.*c', 4000000, 'a') LIKE '%'||printf('%.*c', 2000, 'a')||'b'",
            [],
            |row| row.get::<_, i64>(0),
        )
        .unwrap_err();
    assert_eq!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::OperationInterrupted),
        "{err}"
    );
    assert_eq!(
        job.stop_reason(),
        Some(crate::engine::sqlite::control::StopReason::Deadline)
    );
}
