//! What a real PostgreSQL never sends, or sends only in rare states, answered by a backend
//! scripted byte by byte over an in-memory pipe: the login methods a test cluster does not ask
//! for (cleartext, MD5) and `require_scram`'s refusal of them before the password leaves,
//! lengths below the protocol's minimum, a message exactly at the limit and one byte past it, a
//! `FATAL` in the middle of a flight (told from an ordinary refusal), messages after a flight's
//! last `Sync` and answers after its last `ReadyForQuery`, input that cannot be encoded, backend
//! messages that do not parse, the polite close after a flight that was never sent, a row's
//! cells walked in order (and its statement's tag) and a row whose cells overrun it or whose
//! cell length is below `NULL`'s, a `Describe` answered without its parameters or with a row,
//! the buffers given back after a 20 MiB row and parameter and none reserved for a header
//! alone, the parameters kept bounded, the futures' `Send`, and a read given up by a timeout
//! part-way through a message.

use postgres_protocol::authentication::md5_hash;
use sqlhttp_pgwire::{
    Answer, Connection, Error, Format, Limits, Param, Startup, TransactionStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

/// A backend message: its type byte, its length (which counts itself) and its payload.
fn message(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![tag];
    bytes.extend_from_slice(&(payload.len() as u32 + 4).to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn auth(code: u32, extra: &[u8]) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(extra);
    message(b'R', &payload)
}

/// `AuthenticationOk`, the backend's key, and `ReadyForQuery` idle.
fn logged_in() -> Vec<u8> {
    let mut bytes = auth(0, &[]);
    let mut key = 4242i32.to_be_bytes().to_vec();
    key.extend_from_slice(&7i32.to_be_bytes());
    bytes.extend(message(b'K', &key));
    bytes.extend(message(b'Z', b"I"));
    bytes
}

fn fatal() -> Vec<u8> {
    message(
        b'E',
        b"SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0",
    )
}

/// The backend's end of the pipe.
struct Backend(DuplexStream);

impl Backend {
    /// The startup message (no type byte), whole.
    async fn startup(&mut self) -> Vec<u8> {
        let length = self.0.read_u32().await.unwrap() as usize;
        let mut rest = vec![0; length - 4];
        self.0.read_exact(&mut rest).await.unwrap();
        rest
    }

    /// One frontend message: its type byte and payload, `None` at the end of the stream.
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        let tag = self.0.read_u8().await.ok()?;
        let length = self.0.read_u32().await.unwrap() as usize;
        let mut payload = vec![0; length - 4];
        self.0.read_exact(&mut payload).await.unwrap();
        Some((tag, payload))
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).await.unwrap();
    }
}

fn startup(password: Option<&'static [u8]>, require_scram: bool) -> Startup<'static> {
    Startup {
        user: "app",
        database: Some("db"),
        password,
        application_name: None,
        require_scram,
    }
}

/// A client logged in over a trusting backend, with `limits`.
async fn logged_in_pair(limits: Limits) -> (Connection<DuplexStream>, Backend) {
    let (client, server) = duplex(1 << 20);
    let mut backend = Backend(server);
    let serve = async {
        backend.startup().await;
        backend.send(&logged_in()).await;
    };
    let login = startup(None, false);
    let (connection, ()) = tokio::join!(Connection::startup(client, &login, limits), serve);
    (connection.unwrap(), backend)
}

#[tokio::test]
async fn cleartext_and_md5_send_what_the_server_asked_for() {
    let (client, server) = duplex(1 << 16);
    let mut backend = Backend(server);
    let serve = async {
        let parameters = backend.startup().await;
        assert!(parameters.windows(4).any(|w| w == b"app\0"));
        backend.send(&auth(3, &[])).await;
        assert_eq!(backend.next().await, Some((b'p', b"secret\0".to_vec())));
        backend.send(&logged_in()).await;
    };
    let login = startup(Some(b"secret"), false);
    let (connection, ()) = tokio::join!(
        Connection::startup(client, &login, Limits::default()),
        serve
    );
    let connection = connection.unwrap();
    assert!(connection.is_clean());
    assert_eq!(connection.backend_key().process_id, 4242);

    let (client, server) = duplex(1 << 16);
    let mut backend = Backend(server);
    let salt = [1, 2, 3, 4];
    let serve = async {
        backend.startup().await;
        backend.send(&auth(5, &salt)).await;
        let mut expected = md5_hash(b"app", b"secret", salt).into_bytes();
        expected.push(0);
        assert_eq!(backend.next().await, Some((b'p', expected)));
        backend.send(&logged_in()).await;
    };
    let login = startup(Some(b"secret"), false);
    let (connection, ()) = tokio::join!(
        Connection::startup(client, &login, Limits::default()),
        serve
    );
    assert!(connection.unwrap().is_clean());
}

#[tokio::test]
async fn require_scram_refuses_weaker_methods_before_the_password_leaves() {
    for method in [auth(3, &[]), auth(5, &[9, 9, 9, 9]), logged_in()] {
        let (client, server) = duplex(1 << 16);
        let mut backend = Backend(server);
        let serve = async {
            backend.startup().await;
            backend.send(&method).await;
        };
        let login = startup(Some(b"secret"), true);
        let (refused, ()) = tokio::join!(
            Connection::startup(client, &login, Limits::default()),
            serve
        );
        match refused {
            Err(Error::Authentication(what)) => assert!(what.contains("SCRAM"), "{what}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("logged in without SCRAM"),
        }
        // The client is gone and sent nothing after its startup message.
        assert_eq!(backend.next().await, None);
    }
}

#[tokio::test]
async fn a_length_below_the_minimum_is_a_protocol_error() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    backend.send(&[b'1', 0, 0, 0, 3]).await;
    assert!(matches!(answers.next().await, Err(Error::Protocol(_))));
    assert!(connection.is_in_doubt());
}

#[tokio::test]
async fn a_message_exactly_at_the_limit_is_read_and_one_byte_more_is_refused() {
    let limit = 1024;
    let (mut connection, mut backend) = logged_in_pair(Limits { max_message: limit }).await;
    // A DataRow of one cell filling the limit: type byte + length + count + cell length + cell.
    let cell = vec![b'x'; limit - 1 - 4 - 2 - 4];
    let row = |cell: &[u8]| {
        let mut payload = 1u16.to_be_bytes().to_vec();
        payload.extend_from_slice(&(cell.len() as i32).to_be_bytes());
        payload.extend_from_slice(cell);
        message(b'D', &payload)
    };
    assert_eq!(row(&cell).len(), limit);

    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let mut reply = message(b'1', &[]);
    reply.extend(message(b'2', &[]));
    reply.extend(row(&cell));
    reply.extend(message(b'C', b"SELECT 1\0"));
    reply.extend(message(b'Z', b"I"));
    backend.send(&reply).await;
    let mut rows = 0;
    while let Some(answer) = answers.next().await.unwrap() {
        if let Answer::Row(row) = answer {
            assert_eq!(row.cells().unwrap(), [Some(&cell[..])]);
            rows += 1;
        }
    }
    assert_eq!(rows, 1);
    assert!(connection.is_clean());

    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let mut longer = cell.clone();
    longer.push(b'x');
    // Only the header is sent: the refusal must not wait for the body.
    backend.send(&row(&longer)[..5]).await;
    match answers.next().await {
        Err(Error::TooLarge {
            tag,
            declared,
            limit: refused_at,
        }) => {
            assert_eq!((tag, declared, refused_at), (b'D', limit + 1, limit));
        }
        other => panic!("{other:?}"),
    }
    assert!(connection.is_in_doubt());
}

#[tokio::test]
async fn a_fatal_error_mid_flight_is_the_connection_s_failure() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    flight.statement("COMMIT").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let mut reply = message(b'1', &[]);
    reply.extend(message(b'2', &[]));
    reply.extend(fatal());
    backend.send(&reply).await;
    assert!(matches!(
        answers.next().await.unwrap(),
        Some(Answer::ParseComplete)
    ));
    assert!(matches!(
        answers.next().await.unwrap(),
        Some(Answer::BindComplete)
    ));
    match answers.next().await {
        Err(Error::Fatal(e)) => assert_eq!(e.code, "57P01"),
        Err(e) => panic!("a FATAL came as another failure: {e:?}"),
        Ok(answer) => panic!("a FATAL came as an answer: {answer:?}"),
    }
    assert!(connection.is_in_doubt(), "the COMMIT's outcome is unknown");
}

/// A `COMMIT` refused (its transaction rolled back, the outcome known) and one whose session
/// ended (the outcome unknown) are told apart by their variant, not by the severity.
#[tokio::test]
async fn finish_tells_a_refused_commit_from_one_whose_session_ended() {
    let refused = message(
        b'E',
        b"SERROR\0VERROR\0C40001\0Mcould not serialize access\0\0",
    );
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    flight.statement("COMMIT").unwrap().sync();
    let answers = flight.send().await.unwrap();
    let mut reply = message(b'1', &[]);
    reply.extend(message(b'2', &[]));
    reply.extend(refused);
    reply.extend(message(b'Z', b"I"));
    backend.send(&reply).await;
    match answers.finish().await {
        Err(Error::Db(e)) => assert_eq!(e.code, "40001"),
        other => panic!("{other:?}"),
    }
    assert!(connection.is_clean());

    let mut flight = connection.flight().unwrap();
    flight.statement("COMMIT").unwrap().sync();
    let answers = flight.send().await.unwrap();
    let mut reply = message(b'1', &[]);
    reply.extend(message(b'2', &[]));
    reply.extend(fatal());
    backend.send(&reply).await;
    match answers.finish().await {
        Err(Error::Fatal(e)) => assert_eq!(e.code, "57P01"),
        other => panic!("{other:?}"),
    }
    assert!(connection.is_in_doubt());
}

#[tokio::test]
async fn a_flight_with_messages_after_its_last_sync_is_refused_and_sends_nothing() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    // Sent, BEGIN would run after the last ReadyForQuery, and its answers (and its open
    // transaction) would be the next flight's.
    flight.statement("SELECT 1").unwrap().sync();
    flight.statement("BEGIN").unwrap();
    assert!(flight.send().await.is_err());
    assert!(connection.is_clean(), "nothing was sent");
    connection.close().await.unwrap();
    assert_eq!(backend.next().await, Some((b'X', Vec::new())));
    assert_eq!(backend.next().await, None);
}

/// The caller's input that cannot be encoded is the caller's error, not the connection's: the
/// connection is clean and nothing was sent.
#[tokio::test]
async fn input_that_cannot_be_encoded_is_invalid_and_sends_nothing() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    match flight.statement("SELECT '\0'") {
        Err(Error::Invalid(_)) => {}
        other => panic!("{other:?}"),
    }
    flight.sync();
    assert!(matches!(flight.send().await, Err(Error::Invalid(_))));
    assert!(connection.is_clean());

    let mut flight = connection.flight().unwrap();
    flight.parse("", "SELECT 1", &[]).unwrap();
    let params = vec![
        Param {
            format: Format::Text,
            value: None,
        };
        65_536
    ];
    match flight.bind("", "", &params, Format::Text) {
        Err(Error::Invalid(_)) => {}
        other => panic!("{other:?}"),
    }
    flight.sync();
    assert!(matches!(flight.send().await, Err(Error::Invalid(_))));
    assert!(connection.is_clean());

    match connection.describe("a\0name", "SELECT 1", &[]).await {
        Err(Error::Invalid(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(connection.is_clean());
    connection.close().await.unwrap();
    assert_eq!(backend.next().await, Some((b'X', Vec::new())));
    assert_eq!(backend.next().await, None);
}

/// A backend message that does not parse is the backend's protocol error, not the socket's.
#[tokio::test]
async fn a_backend_message_that_does_not_parse_is_a_protocol_error() {
    for malformed in [
        // A type no backend message has.
        message(b'~', &[]),
        // An ErrorResponse without its terminator.
        message(b'E', b"SERROR\0C42601\0Mno end"),
        // A command tag that is not UTF-8.
        message(b'C', b"SELECT \xff\0"),
        // A RowDescription whose field is cut short.
        message(b'T', &[0, 1, b'a', 0, 0, 0]),
        // A RowDescription whose column's format is neither text (0) nor binary (1).
        {
            let mut column = b"a\0".to_vec();
            column.extend_from_slice(&0u32.to_be_bytes()); // table OID
            column.extend_from_slice(&0i16.to_be_bytes()); // column number
            column.extend_from_slice(&23u32.to_be_bytes()); // type OID (int4)
            column.extend_from_slice(&4i16.to_be_bytes()); // type size
            column.extend_from_slice(&(-1i32).to_be_bytes()); // type modifier
            column.extend_from_slice(&7i16.to_be_bytes()); // format
            message(b'T', &[&1u16.to_be_bytes()[..], &column].concat())
        },
    ] {
        let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight.statement("SELECT 1").unwrap().sync();
        let mut answers = flight.send().await.unwrap();
        let mut reply = message(b'1', &[]);
        reply.extend(message(b'2', &[]));
        reply.extend(malformed);
        reply.extend(message(b'Z', b"I"));
        backend.send(&reply).await;
        let failed = loop {
            match answers.next().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the flight ended"),
                Err(e) => break e,
            }
        };
        assert!(matches!(failed, Error::Protocol(_)), "{failed:?}");
        assert!(connection.is_in_doubt());
        match connection.flight() {
            Err(Error::Invalid(_)) => {}
            other => panic!("a flight on a connection in doubt: {other:?}"),
        }
    }
}

/// A backend that answers more than the flight asked for (here one message after the last
/// `ReadyForQuery`) would have the next flight read it as its own: the connection is in doubt
/// instead.
#[tokio::test]
async fn bytes_after_the_last_ready_for_query_leave_the_connection_in_doubt() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let answers = flight.send().await.unwrap();
    let mut reply = select_reply(&[data_row(&[Some(b"1")])]);
    reply.extend(message(b'C', b"SELECT 1\0"));
    backend.send(&reply).await;
    assert_eq!(answers.finish().await.unwrap(), TransactionStatus::Idle);
    assert!(connection.is_in_doubt());
    assert!(!connection.is_clean());
    assert!(matches!(connection.flight(), Err(Error::Invalid(_))));
}

/// PostgreSQL reports a fixed set of parameters; a backend that reports new names without end
/// does not make the connection keep them all.
#[tokio::test]
async fn the_parameters_kept_are_bounded() {
    let (client, server) = duplex(1 << 20);
    let mut backend = Backend(server);
    let status = |name: &str, value: &str| message(b'S', format!("{name}\0{value}\0").as_bytes());
    let serve = async {
        backend.startup().await;
        let mut reply = auth(0, &[]);
        for i in 0..1000 {
            reply.extend(status(&format!("p{i}"), "x"));
        }
        reply.extend(status("p0", "changed"));
        reply.extend(message(b'Z', b"I"));
        backend.send(&reply).await;
    };
    let login = startup(None, false);
    let (connection, ()) = tokio::join!(
        Connection::startup(client, &login, Limits::default()),
        serve
    );
    let connection = connection.unwrap();
    assert_eq!(connection.parameter("p0"), Some("changed"));
    assert_eq!(connection.parameter("p63"), Some("x"));
    assert_eq!(connection.parameter("p999"), None);
    assert!(connection.is_clean());
}

#[tokio::test]
async fn close_sends_only_terminate_after_a_flight_that_was_never_sent() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    {
        let mut flight = connection.flight().unwrap();
        flight.statement("COMMIT").unwrap().sync();
        // Abandoned: never sent.
    }
    connection.close().await.unwrap();
    assert_eq!(backend.next().await, Some((b'X', Vec::new())));
    assert_eq!(backend.next().await, None);
}

/// A `DataRow` of `cells` (`None` for `NULL`), as the backend frames it.
fn data_row(cells: &[Option<&[u8]>]) -> Vec<u8> {
    let mut payload = (cells.len() as u16).to_be_bytes().to_vec();
    for cell in cells {
        match cell {
            Some(bytes) => {
                payload.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                payload.extend_from_slice(bytes);
            }
            None => payload.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    message(b'D', &payload)
}

/// A flight's answers to `SELECT ...`: ParseComplete, BindComplete, `rows`, CommandComplete and
/// ReadyForQuery idle.
fn select_reply(rows: &[Vec<u8>]) -> Vec<u8> {
    let mut reply = message(b'1', &[]);
    reply.extend(message(b'2', &[]));
    for row in rows {
        reply.extend_from_slice(row);
    }
    reply.extend(message(b'C', b"SELECT 1\0"));
    reply.extend(message(b'Z', b"I"));
    reply
}

#[tokio::test]
async fn a_row_s_cells_are_walked_in_order_with_their_count_and_the_tag_read_in_place() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let cells: [Option<&[u8]>; 4] = [Some(b"42"), None, Some(b""), Some(b"last")];
    backend
        .send(&select_reply(&[data_row(&cells), data_row(&[])]))
        .await;
    let mut rows = Vec::new();
    let mut tags = Vec::new();
    while let Some(answer) = answers.next().await.unwrap() {
        match answer {
            Answer::Row(row) => rows.push(row),
            Answer::CommandComplete(tag) => tags.push(tag),
            _ => {}
        }
    }
    let [tag] = tags.as_slice() else {
        panic!("{tags:?}")
    };
    assert_eq!(
        (tag.as_str(), tag.to_string()),
        ("SELECT 1", "SELECT 1".to_owned())
    );
    assert_eq!(*tag, "SELECT 1");
    let [row, empty] = rows.as_slice() else {
        panic!("{rows:?}")
    };
    assert_eq!(row.len(), 4);
    assert!(!row.is_empty());
    let mut walked = row.iter();
    assert_eq!(walked.len(), 4);
    assert_eq!(walked.next(), Some(Some(&b"42"[..])));
    assert_eq!(walked.len(), 3);
    assert_eq!(walked.collect::<Vec<_>>(), cells[1..]);
    let mut nulls = 0;
    for cell in row {
        nulls += usize::from(cell.is_none());
    }
    assert_eq!(nulls, 1);
    assert_eq!(row.cells().unwrap(), cells);
    assert_eq!((empty.len(), empty.is_empty()), (0, true));
    assert_eq!(empty.iter().next(), None);
    assert!(connection.is_clean());
}

#[tokio::test]
async fn a_row_whose_cell_overruns_it_is_refused_when_it_arrives() {
    for malformed in [
        // A cell declares 10 bytes and 3 follow.
        message(b'D', &[0, 1, 0, 0, 0, 10, b'a', b'b', b'c']),
        // Two cells counted, one sent.
        message(b'D', &[0, 2, 0, 0, 0, 1, b'a']),
        // Bytes after the last cell.
        message(b'D', &[0, 1, 0, 0, 0, 1, b'a', b'!']),
        // A cell length below -1 (NULL's): -2, and i32::MIN.
        message(b'D', &[0, 1, 0xff, 0xff, 0xff, 0xfe]),
        message(b'D', &[0, 2, 0, 0, 0, 1, b'a', 0x80, 0, 0, 0]),
    ] {
        let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
        let mut flight = connection.flight().unwrap();
        flight.statement("SELECT 1").unwrap().sync();
        let mut answers = flight.send().await.unwrap();
        backend.send(&select_reply(&[malformed])).await;
        let refused = loop {
            match answers.next().await {
                Ok(Some(Answer::Row(row))) => panic!("a malformed row was handed over: {row:?}"),
                Ok(Some(_)) => {}
                Ok(None) => panic!("the flight ended"),
                Err(e) => break e,
            }
        };
        assert!(matches!(refused, Error::Protocol(_)), "{refused}");
        assert!(connection.is_in_doubt());
    }
}

#[tokio::test]
async fn a_describe_answered_without_its_parameters_or_with_a_row_is_a_protocol_error() {
    let no_parameters = [message(b'1', &[]), message(b'n', &[]), message(b'Z', b"I")].concat();
    let a_row = [
        message(b'1', &[]),
        message(b't', &[0, 0]),
        data_row(&[Some(b"1")]),
        message(b'Z', b"I"),
    ]
    .concat();
    for reply in [no_parameters, a_row] {
        let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
        let serve = async {
            // Parse, Describe, Sync: then the reply.
            for tag in [b'P', b'D', b'S'] {
                assert_eq!(backend.next().await.unwrap().0, tag);
            }
            backend.send(&reply).await;
        };
        let (described, ()) = tokio::join!(connection.describe("s", "SELECT 1", &[]), serve);
        assert!(
            matches!(described, Err(Error::Protocol(_))),
            "{described:?}"
        );
        assert!(connection.is_in_doubt());
    }
}

#[tokio::test]
async fn after_a_large_row_the_connection_keeps_none_of_its_bytes() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let cell = vec![b'x'; 20 << 20];
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT large").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let reply = select_reply(&[data_row(&[Some(&cell)])]);
    let read = async {
        let mut rows = Vec::new();
        while let Some(answer) = answers.next().await.unwrap() {
            if let Answer::Row(row) = answer {
                rows.push(row);
            }
        }
        rows
    };
    let (rows, ()) = tokio::join!(read, backend.send(&reply));
    let [row] = rows.as_slice() else {
        panic!("{rows:?}")
    };
    assert!(row.iter().eq([Some(&cell[..])]));
    assert!(connection.is_clean());
    // The row holds the buffer it was cut from, and nothing else does: once the row is dropped,
    // so are its 20 MiB, however long the connection stays pooled.
    assert!(
        row.bytes().is_unique(),
        "the connection's read buffer still shares the large row's allocation"
    );

    // The connection reads on as before.
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT small").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    backend
        .send(&select_reply(&[data_row(&[Some(b"small")])]))
        .await;
    let mut cells = Vec::new();
    while let Some(answer) = answers.next().await.unwrap() {
        if let Answer::Row(row) = answer {
            cells.extend(row.iter().map(|cell| cell.map(<[u8]>::to_vec)));
        }
    }
    assert_eq!(cells, [Some(b"small".to_vec())]);
    assert!(connection.is_clean());
}

#[tokio::test]
async fn a_large_row_or_parameter_is_not_kept_by_the_connection_once_carried() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let usual = 256 * 1024;
    assert!(connection.buffer_capacity() < usual);
    let cell = vec![b'x'; 20 << 20];

    // A row written out and dropped as it arrives, as a row writer does.
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT large").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let reply = select_reply(&[data_row(&[Some(&cell)])]);
    let read = async {
        let mut lengths = Vec::<usize>::new();
        while let Some(answer) = answers.next().await.unwrap() {
            if let Answer::Row(row) = answer {
                lengths.push(row.iter().map(|cell| cell.map_or(0, <[u8]>::len)).sum());
            }
        }
        lengths
    };
    let serve = async {
        // Parse, Bind, Execute, Sync: then the reply.
        for _ in 0..4 {
            backend.next().await.unwrap();
        }
        backend.send(&reply).await;
    };
    let (lengths, ()) = tokio::join!(read, serve);
    assert_eq!(lengths, [cell.len()]);
    assert!(connection.is_clean());
    let held = connection.buffer_capacity();
    assert!(held < usual, "the read buffer kept {held} bytes");

    // A parameter as large, sent.
    let mut flight = connection.flight().unwrap();
    flight
        .parse("", "SELECT $1", &[])
        .unwrap()
        .bind(
            "",
            "",
            &[Param {
                format: Format::Binary,
                value: Some(&cell),
            }],
            Format::Binary,
        )
        .unwrap()
        .execute("", 0)
        .unwrap()
        .sync();
    let serve = async {
        let mut bound = 0;
        while let Some((tag, payload)) = backend.next().await {
            if tag == b'B' {
                bound = payload.len();
            }
            if tag == b'S' {
                break;
            }
        }
        backend.send(&select_reply(&[])).await;
        bound
    };
    let (answers, bound) = tokio::join!(flight.send(), serve);
    assert!(bound > cell.len());
    answers.unwrap().finish().await.unwrap();
    let held = connection.buffer_capacity();
    assert!(held < usual, "the write buffer kept {held} bytes");
}

/// A header alone does not make the connection hold the length it declares: a backend (or
/// whatever sits on the link) that sends a large message's header and stalls costs each pooled
/// connection a read chunk, not the message.
#[tokio::test]
async fn a_header_alone_does_not_make_the_connection_hold_its_length() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let usual = 256 * 1024;
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let declared = 32u32 << 20;
    let mut header = vec![b'D'];
    header.extend_from_slice(&declared.to_be_bytes());
    header.extend_from_slice(&[0, 1, 0, 0, 0, 9]);
    backend.send(&header).await;
    let wait = std::time::Duration::from_millis(20);
    assert!(tokio::time::timeout(wait, answers.next()).await.is_err());
    let held = connection.buffer_capacity();
    assert!(
        held < usual,
        "a header made the connection hold {held} bytes"
    );
}

/// A request's future holds the connection and its flight across awaits, on a runtime that may
/// move it between threads: each of them must be `Send` (checked where this compiles).
#[tokio::test]
async fn the_connection_and_its_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let (mut connection, _backend) = logged_in_pair(Limits::default()).await;
    send(&connection);
    {
        let describe = connection.describe("", "SELECT 1", &[]);
        send(&describe);
    }
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    send(&flight);
    let sending = flight.send();
    send(&sending);
    let mut answers = sending.await.unwrap();
    send(&answers);
    let next = answers.next();
    send(&next);
}

/// The engine bounds a flight with a timeout and may read on after it (a cancel request sent,
/// the statement's error awaited): a read given up part-way loses nothing of the stream.
#[tokio::test]
async fn a_read_given_up_by_a_timeout_loses_nothing() {
    let (mut connection, mut backend) = logged_in_pair(Limits::default()).await;
    let mut flight = connection.flight().unwrap();
    flight.statement("SELECT 1").unwrap().sync();
    let mut answers = flight.send().await.unwrap();
    let reply = select_reply(&[data_row(&[Some(b"1")])]);
    let wait = std::time::Duration::from_millis(20);
    // Nothing yet, then half a message's header, then the rest of the row but one byte.
    assert!(tokio::time::timeout(wait, answers.next()).await.is_err());
    // After ParseComplete and BindComplete, five bytes each.
    let row_starts = 10;
    assert_eq!(reply[row_starts], b'D');
    backend.send(&reply[..row_starts + 3]).await;
    assert!(matches!(
        answers.next().await.unwrap(),
        Some(Answer::ParseComplete)
    ));
    assert!(matches!(
        answers.next().await.unwrap(),
        Some(Answer::BindComplete)
    ));
    assert!(tokio::time::timeout(wait, answers.next()).await.is_err());
    let row_ends = row_starts + data_row(&[Some(b"1")]).len();
    backend.send(&reply[row_starts + 3..row_ends - 1]).await;
    assert!(tokio::time::timeout(wait, answers.next()).await.is_err());
    backend.send(&reply[row_ends - 1..]).await;
    match answers.next().await.unwrap() {
        Some(Answer::Row(row)) => assert!(row.iter().eq([Some(&b"1"[..])])),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        answers.next().await.unwrap(),
        Some(Answer::CommandComplete(_))
    ));
    assert!(matches!(
        answers.next().await.unwrap(),
        Some(Answer::ReadyForQuery(_))
    ));
    assert!(answers.next().await.unwrap().is_none());
    assert!(connection.is_clean());
}
