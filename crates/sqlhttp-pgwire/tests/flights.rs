//! The connection against a real PostgreSQL (`SQLHTTPD_TEST_POSTGRES_URL`, a superuser's URL on
//! loopback, as `scripts/start-postgres` prints): a read as one flight with one `Sync`, an error
//! in the middle of a flight and the session after it, a refusal told from a session's end, the
//! routine an error names (a client's `RAISE` told from PostgreSQL's own), a statement described
//! in one flight and a refused one, the bound on a message and the read buffer after a large
//! row, a flight's answers dropped half read, and a cancel request.

use std::time::Duration;

use sqlhttp_pgwire::{
    Answer, Column, Connection, Error, Format, Limits, Param, RowPast, Startup, TransactionStatus,
    cancel,
};
use tokio::net::TcpStream;

mod support;
use support::needs_postgres;

/// Host:port, user and database of the test cluster's URL.
struct Target {
    address: String,
    user: String,
    database: String,
}

fn target() -> Target {
    let url = std::env::var("SQLHTTPD_TEST_POSTGRES_URL").expect("SQLHTTPD_TEST_POSTGRES_URL");
    parse(&url).expect("a URL of the form postgres://USER@HOST:PORT/DATABASE")
}

fn parse(url: &str) -> Option<Target> {
    let rest = url.strip_prefix("postgres://")?;
    let (user_part, rest) = rest.split_once('@')?;
    let (address, database) = rest.split_once('/')?;
    let database = database.split('?').next()?.to_owned();
    let user = user_part.split(':').next()?.to_owned();
    Some(Target {
        address: address.to_owned(),
        user,
        database,
    })
}

async fn connect(target: &Target, limits: Limits) -> Connection<TcpStream> {
    let stream = TcpStream::connect(&target.address).await.unwrap();
    Connection::startup(
        stream,
        &Startup {
            user: &target.user,
            database: Some(&target.database),
            password: None,
            application_name: Some("sqlhttp-pgwire tests"),
            require_scram: false,
        },
        limits,
    )
    .await
    .unwrap()
}

/// Every answer of a flight, rows as text cells.
async fn answers(
    connection: &mut Connection<TcpStream>,
    build: impl FnOnce(&mut sqlhttp_pgwire::Flight<'_, TcpStream>) -> Result<(), Error>,
) -> Vec<String> {
    let mut flight = connection.flight().unwrap();
    build(&mut flight).unwrap();
    let mut answers = flight.send().await.unwrap();
    let mut seen = Vec::new();
    while let Some(answer) = answers.next().await.unwrap() {
        seen.push(match answer {
            Answer::Row(row) => format!(
                "row {:?}",
                row.iter()
                    .map(|cell| cell.map(|bytes| String::from_utf8_lossy(bytes).into_owned()))
                    .collect::<Vec<_>>()
            ),
            Answer::Error(e) => format!("error {}", e.code),
            Answer::CommandComplete(tag) => format!("complete {tag}"),
            Answer::ReadyForQuery(status) => format!("ready {status:?}"),
            Answer::RowDescription(columns) => format!(
                "columns {:?}",
                columns
                    .to_vec()
                    .unwrap()
                    .into_iter()
                    .map(|c| c.name)
                    .collect::<Vec<_>>()
            ),
            Answer::ParameterDescription(types) => format!("params {types:?}"),
            other => format!("{other:?}"),
        });
    }
    seen
}

needs_postgres! {
    #[tokio::test]
    async fn a_read_is_one_flight_with_one_sync() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        assert!(connection.is_clean());
        assert!(connection.backend_key().process_id > 0);
        assert!(connection.parameter("server_version").is_some());

        // Prepared once (its own flight), as a statement cache would.
        let described = answers(&mut connection, |flight| {
            flight
                .parse("s1", "SELECT $1::int8 + 1 AS next, 'x' AS letter", &[])?
                .describe_statement("s1")?
                .sync();
            Ok(())
        })
        .await;
        assert_eq!(
            described,
            [
                "ParseComplete",
                "params [20]",
                "columns [\"next\", \"letter\"]",
                "ready Idle"
            ]
        );

        let read = answers(&mut connection, |flight| {
            flight
                .statement("BEGIN READ ONLY, ISOLATION LEVEL REPEATABLE READ")?
                .statement(
                    "SELECT pg_catalog.set_config('statement_timeout', '5000', true), \
                 pg_catalog.pg_current_wal_insert_lsn() IS NOT NULL",
                )?
                .bind(
                    "",
                    "s1",
                    &[Param {
                        format: Format::Text,
                        value: Some(b"41"),
                    }],
                    Format::Text,
                )?
                .execute("", 0)?
                .statement("ROLLBACK")?
                .sync();
            Ok(())
        })
        .await;
        assert_eq!(
            read,
            [
                "ParseComplete",
                "BindComplete",
                "complete BEGIN",
                "ParseComplete",
                "BindComplete",
                "row [Some(\"5s\"), Some(\"t\")]",
                "complete SELECT 1",
                "BindComplete",
                "row [Some(\"42\"), Some(\"x\")]",
                "complete SELECT 1",
                "ParseComplete",
                "BindComplete",
                "complete ROLLBACK",
                "ready Idle",
            ]
        );
        assert!(connection.is_clean());
        // The setting was the transaction's: the rollback undid it.
        let after = answers(&mut connection, |flight| {
            flight.statement("SHOW statement_timeout")?.sync();
            Ok(())
        })
        .await;
        assert_eq!(after[2], "row [Some(\"0\")]");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn an_error_skips_to_the_sync_and_the_next_flight_ends_the_failed_transaction() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let failed = answers(&mut connection, |flight| {
            flight
                .statement("BEGIN")?
                .statement("SELECT 1 / 0")?
                .statement("ROLLBACK")?
                .sync();
            Ok(())
        })
        .await;
        assert_eq!(
            failed,
            [
                "ParseComplete",
                "BindComplete",
                "complete BEGIN",
                "ParseComplete",
                // `1 / 0` is folded, and fails, as the statement is planned at Bind.
                "error 22012",
                "ready Failed"
            ],
            "the ROLLBACK behind the error was skipped"
        );
        assert!(!connection.is_clean(), "a failed transaction is still open");
        assert!(!connection.is_in_doubt());

        let ended = answers(&mut connection, |flight| {
            flight.statement("ROLLBACK")?.sync();
            Ok(())
        })
        .await;
        assert_eq!(ended.last().unwrap(), "ready Idle");
        assert!(connection.is_clean());

        // Two Syncs in one flight: the error's skip ends at the first.
        let two = answers(&mut connection, |flight| {
            flight.statement("SELECT 1 / 0")?.sync();
            flight.statement("SELECT 2")?.sync();
            Ok(())
        })
        .await;
        assert_eq!(
            two,
            [
                "ParseComplete",
                "error 22012",
                "ready Idle",
                "ParseComplete",
                "BindComplete",
                "row [Some(\"2\")]",
                "complete SELECT 1",
                "ready Idle"
            ]
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_message_past_the_limit_is_refused_from_its_header() {
        let target = target();
        let mut connection = connect(
            &target,
            Limits {
                max_message: 4 * 1024,
            },
        )
        .await;
        let mut flight = connection.flight().unwrap();
        flight
            .statement("SELECT pg_catalog.repeat('x', 100000)")
            .unwrap()
            .sync();
        let mut answers = flight.send().await.unwrap();
        let refused = loop {
            match answers.next().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the row was read"),
                Err(e) => break e,
            }
        };
        match refused {
            Error::TooLarge {
                tag,
                declared,
                limit,
            } => {
                assert_eq!(tag, b'D');
                assert!(declared > 100_000);
                assert_eq!(limit, 4 * 1024);
            }
            other => panic!("{other}"),
        }
        assert!(connection.is_in_doubt());
        assert!(
            connection.flight().is_err(),
            "a connection in doubt runs nothing more"
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn answers_dropped_half_read_leave_the_connection_in_doubt() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight.statement("SELECT 1").unwrap().sync();
        let mut answers = flight.send().await.unwrap();
        answers.next().await.unwrap();
        assert!(connection.is_in_doubt());
        assert!(!connection.is_clean());
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_flight_without_a_sync_is_refused_and_sends_nothing() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight.statement("SELECT 1").unwrap();
        assert!(matches!(flight.send().await, Err(Error::Invalid(_))));
        assert!(connection.is_clean(), "nothing was sent");
        let next = answers(&mut connection, |flight| {
            flight.statement("SELECT 2")?.sync();
            Ok(())
        })
        .await;
        assert_eq!(
            next[2], "row [Some(\"2\")]",
            "the refused flight's messages are gone"
        );
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_cancel_request_stops_the_running_statement() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let key = connection.backend_key();
        let address = target.address.clone();
        let canceller = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel(TcpStream::connect(&address).await.unwrap(), key)
                .await
                .unwrap();
        });
        let started = std::time::Instant::now();
        let cancelled = answers(&mut connection, |flight| {
            flight.statement("SELECT pg_catalog.pg_sleep(30)")?.sync();
            Ok(())
        })
        .await;
        canceller.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(20));
        assert!(
            cancelled.contains(&"error 57014".to_owned()),
            "{cancelled:?}"
        );
        assert_eq!(connection.transaction_status(), TransactionStatus::Idle);
        assert!(connection.is_clean());
    }
}

needs_postgres! {
    #[tokio::test]
    async fn an_error_names_the_routine_that_raised_it() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight
            .statement(
                "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$",
            )
            .unwrap()
            .sync();
        flight.statement("SELECT 1 / 0").unwrap().sync();
        let mut answers = flight.send().await.unwrap();
        let mut errors = Vec::new();
        while let Some(answer) = answers.next().await.unwrap() {
            if let Answer::Error(e) = answer {
                errors.push(e);
            }
        }
        let [raised, own] = errors.as_slice() else {
            panic!("{errors:?}")
        };
        // A client's RAISE, told from PostgreSQL's own error by the routine that raised it.
        assert_eq!(raised.code, "40001");
        assert_eq!(raised.message, "x");
        assert_eq!(raised.routine.as_deref(), Some("exec_stmt_raise"));
        let context = raised.where_.as_deref().unwrap_or_default();
        assert!(context.contains("PL/pgSQL function"), "{context}");
        assert_eq!(own.code, "22012");
        assert_eq!(own.routine.as_deref(), Some("int4div"));
        assert_eq!(own.where_, None);
        assert!(connection.is_clean());
    }
}

needs_postgres! {
    #[tokio::test]
    async fn describe_gives_a_statement_s_parameters_and_columns_in_one_flight() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let described = connection
            .describe("kv", "SELECT $1::int8 AS k, 'x'::text AS v", &[])
            .await
            .unwrap();
        assert_eq!(described.params, [20]);
        let column = |name: &str, type_oid| Column {
            name: name.to_owned(),
            type_oid,
            table_oid: 0,
            column_id: 0,
            type_modifier: -1,
            format: Format::Text,
        };
        assert_eq!(described.columns, [column("k", 20), column("v", 25)]);
        assert!(connection.is_clean());

        // The statement stays prepared under its name.
        let read = answers(&mut connection, |flight| {
            flight
                .bind(
                    "",
                    "kv",
                    &[Param {
                        format: Format::Text,
                        value: Some(b"7"),
                    }],
                    Format::Text,
                )?
                .execute("", 0)?
                .sync();
            Ok(())
        })
        .await;
        assert_eq!(read[1], "row [Some(\"7\"), Some(\"x\")]");

        // Types given by the Parse stand; a statement without rows is NoData: no columns.
        let typed = connection
            .describe("", "SELECT $1 IS NULL", &[25])
            .await
            .unwrap();
        assert_eq!((typed.params, typed.columns.len()), (vec![25], 1));
        let no_rows = connection
            .describe("", "SET search_path = pg_catalog", &[])
            .await
            .unwrap();
        assert_eq!((no_rows.params, no_rows.columns), (vec![], vec![]));
        assert!(connection.is_clean());
    }
}

needs_postgres! {
    /// An ordinary refusal read to its `ReadyForQuery` leaves the connection usable; a session
    /// PostgreSQL ends (here by terminating its own backend) is a different variant, in doubt.
    #[tokio::test]
    async fn finish_tells_a_refusal_from_the_end_of_the_session() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight.statement("SELECT 1/0").unwrap().sync();
        match flight.send().await.unwrap().finish().await {
            Err(Error::Db(e)) => assert_eq!(e.code, "22012", "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(connection.is_clean());

        let mut flight = connection.flight().unwrap();
        flight
            .statement("SELECT pg_terminate_backend(pg_backend_pid())")
            .unwrap()
            .sync();
        match flight.send().await.unwrap().finish().await {
            Err(Error::Fatal(e)) => assert_eq!(e.code, "57P01", "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(connection.is_in_doubt());
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_refused_describe_is_the_database_s_error_and_the_connection_stays_usable() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        for (sql, code) in [
            ("SELEC 1", "42601"),
            ("SELECT * FROM no_such_table", "42P01"),
        ] {
            match connection.describe("s", sql, &[]).await {
                Err(Error::Db(e)) => assert_eq!(e.code, code, "{e}"),
                other => panic!("{sql}: {other:?}"),
            }
            assert!(!connection.is_in_doubt());
            assert!(connection.is_clean());
        }
        // Nothing was prepared under the name: it is free for the next statement.
        let described = connection.describe("s", "SELECT 1 AS one", &[]).await.unwrap();
        assert_eq!(described.columns[0].name, "one");
        let next = answers(&mut connection, |flight| {
            flight.statement("SELECT 2")?.sync();
            Ok(())
        })
        .await;
        assert_eq!(next[2], "row [Some(\"2\")]");

        // Inside a transaction the refusal fails it; the connection is still not in doubt.
        answers(&mut connection, |flight| {
            flight.statement("BEGIN")?.sync();
            Ok(())
        })
        .await;
        assert!(matches!(
            connection.describe("", "SELEC 1", &[]).await,
            Err(Error::Db(_))
        ));
        assert_eq!(connection.transaction_status(), TransactionStatus::Failed);
        assert!(!connection.is_in_doubt() && !connection.is_clean());
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_large_row_read_from_postgres_leaves_the_buffers_their_usual_size() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight
            .statement("SELECT pg_catalog.repeat('x', 20000000)")
            .unwrap()
            .sync();
        let mut answers = flight.send().await.unwrap();
        let mut lengths = Vec::new();
        while let Some(answer) = answers.next().await.unwrap() {
            if let Answer::Row(row) = answer {
                lengths.extend(row.iter().map(|cell| cell.map_or(0, <[u8]>::len)));
            }
        }
        assert_eq!(lengths, [20_000_000]);
        assert!(connection.is_clean());
        let held = connection.buffer_capacity();
        assert!(held < 256 * 1024, "the connection kept {held} bytes");
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_simple_query_after_a_sync_is_answered_in_the_same_flight() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let seen = answers(&mut connection, |flight| {
            flight.statement("BEGIN")?.statement("SELECT 1 / 0")?.sync();
            // Its own ReadyForQuery ends it: the error above skips nothing of it.
            flight.query("ROLLBACK; SELECT 'a' AS x")?;
            flight.query("SELECT 1 / 0; SELECT 3")?;
            Ok(())
        })
        .await;
        assert_eq!(
            seen,
            [
                "ParseComplete",
                "BindComplete",
                "complete BEGIN",
                "ParseComplete",
                "error 22012",
                "ready Failed",
                "complete ROLLBACK",
                "columns [\"x\"]",
                "row [Some(\"a\")]",
                "complete SELECT 1",
                "ready Idle",
                // An error skips the rest of its Query, not what follows it.
                "error 22012",
                "ready Idle",
            ]
        );
        assert!(connection.is_clean());
    }
}

needs_postgres! {
    #[tokio::test]
    async fn a_simple_query_before_its_flights_sync_is_refused_and_sends_nothing() {
        let target = target();
        let mut connection = connect(&target, Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight.statement("SELECT 1").unwrap();
        assert!(matches!(flight.query("SELECT 2"), Err(Error::Invalid(_))));
        flight.sync();
        assert!(matches!(flight.send().await, Err(Error::Invalid(_))));
        assert!(connection.is_clean(), "nothing was sent");
        let next = answers(&mut connection, |flight| {
            flight.query("SELECT 4")?;
            Ok(())
        })
        .await;
        assert_eq!(next, ["columns [\"?column?\"]", "row [Some(\"4\")]", "complete SELECT 1", "ready Idle"]);
    }
}

/// Runs `sql`, whose row is refused from its header, and reads where that row passes a cell
/// bound of 5000 bytes or a row bound of 4000.
async fn refused_row(connection: &mut Connection<TcpStream>, sql: &str) -> RowPast {
    let mut flight = connection.flight().unwrap();
    flight.statement(sql).unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    loop {
        match answers.next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the row was read"),
            Err(Error::TooLarge { tag: b'D', .. }) => break,
            Err(other) => panic!("{other}"),
        }
    }
    answers.row_past_bounds(5000, 4000).await.unwrap()
}

needs_postgres! {
    #[tokio::test]
    async fn a_refused_row_names_the_cell_past_its_bound_from_the_cells_lengths() {
        let target = target();
        let limits = Limits {
            max_message: 4 * 1024,
        };
        let mut connection = connect(&target, limits).await;
        let past = refused_row(
            &mut connection,
            "SELECT 1, NULL, pg_catalog.repeat('x', 100000), pg_catalog.repeat('y', 10)",
        )
        .await;
        assert_eq!(past, RowPast::Cell { index: 2, bytes: 100_000 });
        assert!(connection.is_in_doubt());

        // Every cell within its bound, the row past its own: passed over, never held.
        let mut connection = connect(&target, limits).await;
        let past = refused_row(
            &mut connection,
            "SELECT pg_catalog.repeat('a', 3000), pg_catalog.repeat('b', 3000)",
        )
        .await;
        assert_eq!(past, RowPast::Row);
        assert!(connection.is_in_doubt());
    }
}
