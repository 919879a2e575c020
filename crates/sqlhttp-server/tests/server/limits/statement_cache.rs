//! What a PostgreSQL connection's statement cache keeps of statements that failed: nothing.
//! A client can send ever-new texts (each up to `--max-sql-bytes`) that PostgreSQL refuses at
//! `Parse`; none of them may stay held by the server after its answer.

use serde_json::json;

use crate::common::{http_client, rss_of, start};
use crate::engines::{client_role, database, needs_postgres};

needs_postgres! {
    /// Batches run through the driver's statement cache (deadpool's), which kept an empty
    /// entry, with its text, for every statement whose `Parse` failed, and never counted it
    /// towards its bound: 8 000 failing texts of 8 KB grew the server by 64 MiB, for good.
    #[tokio::test]
    async fn statements_refused_at_parse_leave_nothing_held() {
        let Some(url) = database("statements_refused_at_parse_leave_nothing_held").await else {
            return;
        };
        let role = client_role(&url);
        let args = ["--database", url.as_str(), "--client-role", role.as_str(), "--pool-size", "1"];
        let (mut server, base) = start(&args);
        let client = http_client();
        let pad = "x".repeat(64 * 1024);
        let refused = async |i: usize| {
            let sql = format!("SELECT * FROM no_such_table_{i} /* {pad} */");
            let response = client
                .post(format!("{base}/api/v1/batch"))
                .header("content-type", "application/json")
                .body(json!({ "statements": [{ "sql": sql }] }).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 400);
        };
        // The process's heap settles first (the connection, its buffers, the runtime).
        for i in 0..100 {
            refused(i).await;
        }
        let before = rss_of(server.id());
        const TEXTS: usize = 1_500;
        for i in 100..100 + TEXTS {
            refused(i).await;
        }
        let grown = rss_of(server.id()).saturating_sub(before);
        server.kill().unwrap();
        server.wait().unwrap();
        // Held, they would be about 1 500 x 64 KiB = 94 MiB.
        assert!(
            grown < 24 << 20,
            "the server grew by {} MiB over {TEXTS} refused texts of 64 KiB",
            grown >> 20
        );
    }
}
