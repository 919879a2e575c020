//! PostgreSQL's types through the API: how each type's values are written as JSON cells (a
//! type with no mapping is refused with how to cast it), and parameters taking the types
//! PostgreSQL infers for them. More of the mapping's edges (float4, json, years past 9999) are
//! `sql/pg_answers.rs`; SQLite's mapping is `sql/answers.rs`.

use serde_json::json;

use crate::common::{ok, sql};
use crate::engines::{needs_postgres, postgres_app};

needs_postgres! {
    #[tokio::test]
    async fn values_map_to_json_cells() {
        let router = postgres_app!("values_map_to_json_cells");
        let row = ok(
            &router,
            "SELECT true, 7::int2, 12.50::numeric, 'NaN'::float8, \
         '2024-06-01 12:30:00.25+02'::timestamptz, '2024-06-01'::date, '13:14:15'::time, \
         '2024-06-01 01:02:03'::timestamp, '123e4567-e89b-12d3-a456-426614174000'::uuid, \
         '{\"a\": [1, 2]}'::jsonb, '\\x00ff10'::bytea, ARRAY[[1, 2], [3, NULL]]::int4[], \
         '1 day 2 hours'::interval, NULL::text, 123456789012345678901234567890.5::numeric",
            json!([]),
        )
        .await;
        assert_eq!(
            row["rows"][0],
            json!([
                true,
                7,
                "12.50",
                null,
                "2024-06-01T10:30:00.25Z",
                "2024-06-01",
                "13:14:15",
                "2024-06-01T01:02:03",
                "123e4567-e89b-12d3-a456-426614174000",
                {"a": [1, 2]},
                {"base64": "AP8Q"},
                [[1, 2], [3, null]],
                "P1DT2H",
                null,
                "123456789012345678901234567890.5"
            ])
        );
        // A "char" past ASCII is written as PostgreSQL writes it.
        let byte = ok(&router, "SELECT 'é'::\"char\" AS c", json!([])).await;
        assert_eq!(byte["rows"], json!([["\\303"]]));
        let unsupported = sql(&router, "SELECT point(1, 2) AS p", json!([])).await;
        assert_eq!(unsupported.status, 400);
        assert!(
            unsupported.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("p::text")
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn parameters_take_the_types_postgresql_infers() {
        let router = postgres_app!("parameters_take_the_types_postgresql_infers");
        ok(
            &router,
            "CREATE TABLE t (n numeric, d date, u uuid, j jsonb, b bytea, f boolean, a int[])",
            json!([]),
        )
        .await;
        ok(
            &router,
            "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)",
            json!([
                "10.10",
                "2024-02-29",
                "123e4567-e89b-12d3-a456-426614174000",
                "{\"k\": true}",
                {"base64": "AQI="},
                1,
                "{1,2}"
            ]),
        )
        .await;
        let row = ok(
            &router,
            "SELECT n, d, u, j, b, f, a FROM t WHERE n = ? AND j ?? 'k'",
            json!([10.1]),
        )
        .await;
        assert_eq!(
            row["rows"],
            json!([[
                "10.10",
                "2024-02-29",
                "123e4567-e89b-12d3-a456-426614174000",
                {"k": true},
                {"base64": "AQI="},
                true,
                [1, 2]
            ]])
        );
        let wrong = sql(&router, "SELECT ?::int", json!([1, 2])).await;
        assert_eq!(wrong.code(), "SQL_ERROR");
        assert!(
            wrong.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("takes 1")
        );
        let bad = sql(&router, "SELECT ?::int", json!(["x"])).await;
        assert_eq!(bad.code(), "SQL_ERROR");
        let blob = sql(&router, "SELECT ?::int", json!([{"base64": "AA=="}])).await;
        assert_eq!(blob.code(), "SQL_ERROR");
    }
}
