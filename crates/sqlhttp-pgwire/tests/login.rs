//! Login against a cluster that asks every role but `postgres` for its SCRAM-SHA-256 password,
//! started for this test by `scripts/start-postgres` (`START_POSTGRES_AUTH=scram-sha-256`) and
//! stopped at its end: the right password logs in, a wrong one is PostgreSQL's `28P01`, none is
//! refused before anything is sent.

use std::process::Command;

use sqlhttp_pgwire::{Connection, Error, Limits, Startup};
use tokio::net::TcpStream;

mod support;
use support::needs_postgres;

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts");

/// The cluster, stopped (and its directory removed) when dropped.
struct Cluster(String);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(format!("{SCRIPTS}/stop-postgres"))
            .arg(&self.0)
            .status();
    }
}

fn scram_cluster() -> Cluster {
    let output = Command::new(format!("{SCRIPTS}/start-postgres"))
        .env("START_POSTGRES_NO_INSTALL", "1")
        .env("START_POSTGRES_AUTH", "scram-sha-256")
        .output()
        .expect("scripts/start-postgres runs");
    assert!(output.status.success(), "scripts/start-postgres failed");
    Cluster(String::from_utf8(output.stdout).unwrap().trim().to_owned())
}

async fn login(
    address: &str,
    user: &str,
    password: Option<&[u8]>,
    require_scram: bool,
) -> Result<Connection<TcpStream>, Error> {
    let stream = TcpStream::connect(address).await.unwrap();
    let startup = Startup {
        user,
        database: Some("postgres"),
        password,
        application_name: None,
        require_scram,
    };
    Connection::startup(stream, &startup, Limits::default()).await
}

needs_postgres! {
    #[tokio::test]
    async fn scram_logs_in_with_the_password_and_refuses_without_it() {
        let cluster = scram_cluster();
        let address = cluster
            .0
            .trim_start_matches("postgres://postgres@")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let status = Command::new("psql")
            .args([
                cluster.0.as_str(),
                "-q",
                "-c",
                "CREATE ROLE pgwire_scram LOGIN PASSWORD 'correct horse'",
            ])
            .status()
            .unwrap();
        assert!(status.success());

        let connection = login(&address, "pgwire_scram", Some(b"correct horse"), true)
            .await
            .unwrap();
        assert!(connection.is_clean());
        connection.close().await.unwrap();

        match login(&address, "pgwire_scram", Some(b"wrong"), false).await {
            Err(Error::Fatal(e)) => assert_eq!(e.code, "28P01", "{e}"),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a wrong password logged in"),
        }
        match login(&address, "pgwire_scram", None, false).await {
            Err(Error::Authentication(_)) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("no password logged in"),
        }
        // The cluster trusts its superuser on loopback: a login that asks for SCRAM refuses a
        // session let in without an exchange.
        match login(&address, "postgres", Some(b"anything"), true).await {
            Err(Error::Authentication(what)) => assert!(what.contains("no authentication"), "{what}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a trusted login passed for SCRAM"),
        }
        let trusted = login(&address, "postgres", None, false).await.unwrap();
        assert!(trusted.is_clean());
    }
}
