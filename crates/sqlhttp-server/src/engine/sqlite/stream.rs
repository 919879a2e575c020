//! Streaming one SQLite statement's success body while its engine thread steps it: [`execute`]
//! runs the statement through the row writer into the shared chunk [`Sink`], and signals a
//! failure after the first chunk inside the body (see `docs/adr/0016-streamed-results.md`).
//!
//! Runs on an engine thread with a borrowed connection. Knows the row writer and the job's stop
//! conditions (the connection's hooks); nothing about HTTP.

use bytes::Bytes;

use crate::engine::Access;
use crate::engine::sqlite::connection::Conn;
use crate::engine::sqlite::exec::{self, Ran};
use crate::engine::stream::{self, ChunkSender, Chunks, Sink};
use crate::protocol::error::ApiError;
use crate::protocol::request::SqlRequest;
use crate::protocol::result;

/// What running a statement through the stream gave, when it could run where it was sent.
#[derive(Debug)]
pub(crate) enum Streamed {
    /// The whole success body: it fit one chunk, and nothing was sent.
    Whole(Vec<u8>),
    /// The body went through the channel, to its end or to an error written into it.
    Sent,
}

/// Runs the request's statement, sending its success body through `sender` as rows are
/// written. A body that fits one chunk is returned whole instead (`Streamed::Whole`: the caller
/// answers it with a length, and an error before it is an ordinary error response). Once a chunk
/// has been sent, a failure is written into the body as its `"error"` member and the body ends
/// there; nothing that follows can make the client take it for a whole result.
pub(crate) fn execute(
    conn: &Conn,
    request: &SqlRequest,
    access: Access,
    sender: ChunkSender,
) -> Result<Ran<Streamed>, ApiError> {
    let mut out = stream::body_buffer();
    let hooks = &conn.hooks;
    let must_stop = || hooks.must_stop();
    let mut sink = Sink::Stream(Chunks::new(&sender, &must_stop));
    let written = exec::write_result(conn, request, access, &mut out, &mut sink);
    let started = sink.started();
    match written {
        Ok(Ran::NeedsWriter) => Ok(Ran::NeedsWriter),
        Ok(Ran::Done(())) if !started => Ok(Ran::Done(Streamed::Whole(out))),
        Ok(Ran::Done(())) => {
            sender.finish(Bytes::from(out));
            Ok(Ran::Done(Streamed::Sent))
        }
        Err(err) if !started => Err(err),
        Err(err) => {
            if sender.is_gone() {
                // Nobody reads the body any more: the job was cancelled.
                return Err(err);
            }
            let err = if err.interrupted {
                conn.hooks.interrupted_error()
            } else {
                err
            };
            tracing::debug!(code = err.code.as_str(), "statement failed mid-stream");
            // `out` ends after a whole row: close the rows and say why the body ends here.
            result::error_tail(&mut out, &err);
            sender.finish(Bytes::from(out));
            Ok(Ran::Done(Streamed::Sent))
        }
    }
}
