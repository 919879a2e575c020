//! TLS to PostgreSQL (ADR 0033): a cluster of its own with `ssl=on` that takes TCP logins over
//! TLS only (`scripts/start-postgres` with `START_POSTGRES_SSL`, a certificate from
//! [`crate::http::tls::certs`]), against every `sslmode`; and the shared cluster, with `ssl = off`,
//! where `require` is refused and `prefer` goes on in plain text.

use serde_json::json;
use sqlhttp_server::{AppState, Config, app};

use crate::common::ok;
use crate::engines::{needs_postgres, start_cluster_with};
use crate::http::tls::certs;

/// The server starts on `url`, or says why not.
fn start_on(url: &str) -> Result<axum::Router, String> {
    let config = Config {
        database: url.parse().map_err(|e| format!("{e}"))?,
        ..Config::default()
    };
    AppState::new(&config).map(app).map_err(|e| e.to_string())
}

needs_postgres! {
    /// Every sslmode against a PostgreSQL that takes logins over TLS only, with a certificate for
    /// `localhost` from a CA of the test's: what verifies passes (and the pool's sessions are
    /// encrypted), what does not stops the start with a message that says what to change.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_tls_follows_sslmode() {
        let ca = certs(&["localhost"]);
        let other = certs(&["localhost"]);
        let ssl_dir = ca.path().to_str().unwrap();
        let Some(cluster) = start_cluster_with(
            "trust",
            &[
                ("START_POSTGRES_SSL", ssl_dir),
                ("START_POSTGRES_SSL_ONLY", "1"),
            ],
        ) else {
            assert!(
                std::env::var_os("SQLHTTPD_TEST_REQUIRE_POSTGRES").is_none(),
                "cannot start a cluster with ssl=on, and SQLHTTPD_TEST_REQUIRE_POSTGRES is set"
            );
            eprintln!("skipping: no PostgreSQL for scripts/start-postgres");
            return;
        };
        // postgres://postgres@127.0.0.1:PORT/postgres
        let by_ip = cluster.clone();
        let by_name = cluster.replacen("127.0.0.1", "localhost", 1);
        let ca_file = ca.path().join("ca.crt");
        let ca_file = ca_file.to_str().unwrap();
        let other_ca = other.path().join("ca.crt");
        let other_ca = other_ca.to_str().unwrap();

        let encrypted = |url: String| async move {
            let router = start_on(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            let ssl = ok(
                &router,
                "SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()",
                json!([]),
            )
            .await;
            assert_eq!(ssl["rows"], json!([[true]]), "{url}");
        };
        let refused = |url: String, says: &'static [&'static str]| {
            let Err(e) = start_on(&url) else {
                panic!("{url} must not start")
            };
            for words in says {
                assert!(e.contains(words), "{url}: expected {words:?} in: {e}");
            }
        };

        encrypted(format!(
            "{by_name}?sslmode=verify-full&sslrootcert={ca_file}"
        ))
        .await;
        refused(
            format!("{by_name}?sslmode=verify-full"),
            &[
                "not signed by a CA in the built-in roots",
                "pass the CA that signed it",
            ],
        );
        refused(
            format!("{by_name}?sslmode=verify-full&sslrootcert={other_ca}"),
            &[
                "not signed by a CA in sslrootcert=",
                "pass the CA that signed it",
            ],
        );
        refused(
            format!("{by_ip}?sslmode=verify-full&sslrootcert={ca_file}"),
            &[
                "name mismatch: the certificate is for localhost, the URL's host is 127.0.0.1",
                "sslmode=verify-ca",
            ],
        );
        encrypted(format!("{by_ip}?sslmode=verify-ca&sslrootcert={ca_file}")).await;
        refused(
            format!("{by_ip}?sslmode=verify-ca&sslrootcert={other_ca}"),
            &["not signed by a CA in sslrootcert="],
        );
        encrypted(format!("{by_ip}?sslmode=require")).await;
        // libpq's rule: with a root file, `require` checks the chain too.
        refused(
            format!("{by_ip}?sslmode=require&sslrootcert={other_ca}"),
            &["not signed by a CA in sslrootcert="],
        );
        // The default is libpq's, `prefer`: TLS when offered.
        encrypted(by_ip.clone()).await;
        refused(
            format!("{by_ip}?sslmode=disable"),
            &["no encryption", "use sslmode=verify-full"],
        );
    }
}

needs_postgres! {
    /// A PostgreSQL with `ssl = off` answers `N`: `require` says so, `prefer` goes on in plain text.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_postgres_without_tls_is_refused_where_tls_is_required() {
        let Some(url) = crate::engines::database("a_postgres_without_tls").await else {
            return;
        };
        // The shared test cluster has ssl = off (scripts/start-postgres without START_POSTGRES_SSL).
        let plain = tokio_postgres::connect(&url, tokio_postgres::NoTls).await;
        let (client, connection) = plain.unwrap();
        let driver = tokio::spawn(connection);
        let ssl: String = client.query_one("SHOW ssl", &[]).await.unwrap().get(0);
        drop(client);
        let _ = driver.await;
        if ssl == "on" {
            eprintln!("skipping: this cluster has ssl = on");
            return;
        }
        let role = crate::engines::client_role(&url);
        let with_role = |url: String| {
            let sqlhttp_server::Database::Postgres(url) = url.parse().unwrap() else {
                panic!("PostgreSQL");
            };
            Config {
                database: sqlhttp_server::Database::Postgres(url.with_client_role(&role).unwrap()),
                ..Config::default()
            }
        };
        let e = AppState::new(&with_role(format!("{url}?sslmode=require"))).unwrap_err();
        assert!(
            e.to_string().contains(
                "PostgreSQL does not accept TLS (ssl = off), and sslmode=require asks for it"
            ),
            "{e}"
        );
        let router = app(AppState::new(&with_role(format!("{url}?sslmode=prefer"))).unwrap());
        ok(&router, "SELECT 1", json!([])).await;
    }
}
