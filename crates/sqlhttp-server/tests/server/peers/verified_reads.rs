//! A verified read whose answer was lost, asked again: of the same peer, of the other peer on the
//! same database behind a balancing proxy, and of a peer started after the first was killed.
//! Verified reads on the primary run as flights on pooled sessions (ADR 0061); whichever session
//! and peer the second attempt meets, it answers the same rows, as fresh as the write before it,
//! and no session is left in a transaction. (The proxy reads an answer whole before it loses
//! it, so the server finishes the first attempt; a read whose client left while it streamed is
//! `postgres::flights`' test.)
//!
//! A token one peer still accepts and another was restarted without: the read asked again of
//! the second is refused and reads nothing, the client told so after its two attempts.
//!
//! The database comes from [`database`]: these tests skip as the other PostgreSQL tests do.

use std::process::Stdio;

use serde::{Deserialize, Serialize};
use sqlhttp::{Client, ErrorKind};
use sqlhttp_testkit::{ChaosProxy, Fault, ServerProcess};

use super::load_balanced::{direct, quick_retries, replicas};
use crate::common::sqlhttpd;
use crate::engines::{client_role, database, needs_postgres};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Stock {
    id: i64,
    qty: i64,
}

/// The rows the first `n` rounds wrote.
fn written(n: i64) -> Vec<Stock> {
    (1..=n).map(|id| Stock { id, qty: id * 10 }).collect()
}

const ALL: &str = "SELECT id, qty FROM stock ORDER BY id";

/// Sessions of the test's database left in a transaction, as another peer sees them.
async fn open_transactions(client: &Client) -> i64 {
    client
        .query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
        )
        .fetch_one()
        .await
        .unwrap()
}

needs_postgres! {
    #[tokio::test]
    async fn a_verified_read_whose_answer_was_lost_is_answered_alike_by_any_peer_and_after_a_restart() {
        let test =
            "a_verified_read_whose_answer_was_lost_is_answered_alike_by_any_peer_and_after_a_restart";
        let Some(url) = database(test).await else {
            return;
        };
        let (a, b) = replicas(&url).await;
        direct(&a)
            .execute("CREATE TABLE stock (id bigint PRIMARY KEY, qty bigint NOT NULL)")
            .await
            .unwrap();
        let balanced = ChaosProxy::start_balanced([a.addr(), b.addr()]).await.unwrap();
        let client = Client::builder(balanced.url())
            .retry(quick_retries())
            .retry_writes(true)
            .build()
            .unwrap();
        // The same peer asked again: a proxy in front of A alone.
        let only_a = ChaosProxy::start(a.addr()).await.unwrap();
        let client_of_a = Client::builder(only_a.url())
            .retry(quick_retries())
            .build()
            .unwrap();

        for round in 1..=4_i64 {
            // Written through either peer, the client keeping the write's bookmark.
            let inserted = client
                .insert("stock", &[Stock { id: round, qty: round * 10 }])
                .idempotency_key(format!("stock-{round}"))
                .await
                .unwrap();
            assert_eq!(inserted, 1);
            let after_write = client.bookmark().expect("a write's answer names its position");
            // The first answer is lost whole, the second cut short (inside its head): the
            // third attempt answers, on the other peer than the second.
            let sent = balanced.requests();
            balanced.push_all([Fault::DropAfterForward, Fault::Truncate(120)]);
            let rows: Vec<Stock> = client.query(ALL).fetch_all().await.unwrap();
            assert_eq!(rows, written(round), "round {round}, through either peer");
            assert_eq!(balanced.requests() - sent, 3, "two lost answers, one kept");

            // The same read's answer lost on its way back from A, asked of A again.
            client_of_a.observe_bookmark(after_write);
            only_a.push(Fault::DropAfterForward);
            let rows: Vec<Stock> = client_of_a.query(ALL).fetch_all().await.unwrap();
            assert_eq!(rows, written(round), "round {round}, of A twice");
            assert_eq!(only_a.requests(), 2 * round as usize);
        }
        assert!(
            balanced.forwarded_to(a.addr()) > 0 && balanced.forwarded_to(b.addr()) > 0,
            "both peers served: {balanced:?}"
        );
        assert_eq!(open_transactions(&direct(&b)).await, 0, "abandoned reads left nothing open");

        // A dies; its turns fail over to B, and a peer started afterwards answers the same.
        let bookmark = client.bookmark().unwrap();
        a.kill().await.unwrap();
        balanced.push(Fault::DropAfterForward);
        let rows: Vec<Stock> = client.query(ALL).fetch_all().await.unwrap();
        assert_eq!(rows, written(4), "after A's death");
        let (c, _spare) = replicas(&url).await;
        let restarted = Client::builder(c.url())
            .bookmark(bookmark)
            .retry(quick_retries())
            .build()
            .unwrap();
        let proxy_of_c = ChaosProxy::start(c.addr()).await.unwrap();
        let through = Client::builder(proxy_of_c.url())
            .bookmark(bookmark)
            .retry(quick_retries())
            .build()
            .unwrap();
        proxy_of_c.push(Fault::DropAfterForward);
        let rows: Vec<Stock> = through.query(ALL).fetch_all().await.unwrap();
        assert_eq!(rows, written(4), "of a peer started after the kill");
        let rows: Vec<Stock> = restarted.query(ALL).fetch_all().await.unwrap();
        assert_eq!(rows, written(4));
        assert_eq!(open_transactions(&restarted).await, 0);
    }
}

/// A peer on `url` that accepts `tokens`.
async fn peer_with_tokens(url: &str, tokens: &[&str]) -> ServerProcess {
    let mut command = sqlhttpd();
    command
        .args(["--database", url, "--client-role", &client_role(url)])
        .stderr(Stdio::inherit());
    for token in tokens {
        command.args(["--token", token]);
    }
    ServerProcess::spawn_command(command).await.unwrap()
}

needs_postgres! {
    #[tokio::test]
    async fn a_verified_read_asked_again_of_a_peer_that_revoked_its_token_is_refused() {
        let test = "a_verified_read_asked_again_of_a_peer_that_revoked_its_token_is_refused";
        let Some(url) = database(test).await else {
            return;
        };
        // A still accepts "old"; B was restarted without it.
        let (a, b) = tokio::join!(
            peer_with_tokens(&url, &["old", "new"]),
            peer_with_tokens(&url, &["new"])
        );
        let setup = Client::builder(a.url()).bearer_token("new").build().unwrap();
        setup
            .execute("CREATE TABLE stock (id bigint PRIMARY KEY, qty bigint NOT NULL)")
            .await
            .unwrap();
        setup.insert("stock", &written(2)).await.unwrap();
        // Requests alternate between the peers, A first.
        let balanced = ChaosProxy::start_balanced([a.addr(), b.addr()]).await.unwrap();
        let client = |token: &str| {
            Client::builder(balanced.url())
                .bearer_token(token)
                .retry(quick_retries())
                .build()
                .unwrap()
        };

        // A answers and the answer is lost; B refuses the second attempt, which is not tried
        // a third time.
        balanced.push(Fault::DropAfterForward);
        let err = client("old")
            .query(ALL)
            .fetch_all::<Stock>()
            .await
            .expect_err("a revoked token read nothing");
        assert!(matches!(err.kind(), ErrorKind::Unauthorized { .. }), "{err:?}");
        assert_eq!((err.status(), err.attempts()), (Some(401), 2), "{err:?}");
        assert_eq!(balanced.forwarded_to(b.addr()), 1);

        // The token both accept: lost on A, answered by B.
        balanced.push(Fault::DropAfterForward);
        let rows: Vec<Stock> = client("new").query(ALL).fetch_all().await.unwrap();
        assert_eq!(rows, written(2));
        assert_eq!(balanced.requests(), 4);
        assert_eq!(open_transactions(&setup).await, 0);
    }
}
