//! Per-call settings: what one request builder may override of the client's configuration (timeout,
//! retry policy, cancellation; for writes, `retry_writes` and a caller-held idempotency key; for
//! reads, a bookmark to be at least as fresh as and the consistency asked for).
//!
//! Every request builder holds one [`CallOptions`] and gets its setters from the macros below, so a new
//! builder (a batch, say) gains the same settings, with the same documentation, by invoking them. The
//! transport resolves each setting against the client's: a per-call value wins; an unset one falls back.

use std::fmt;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::bookmark::{Bookmark, Consistency};
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;

/// The longest idempotency key the protocol accepts.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// What one call overrides of the client's configuration; `None` means "the client's".
#[derive(Clone, Default)]
pub(crate) struct CallOptions {
    /// The per-attempt timeout; `Some(None)` turns it off for this call.
    pub(crate) timeout: Option<Option<Duration>>,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) retry_writes: Option<bool>,
    /// A caller-held key (writes only).
    pub(crate) idempotency_key: Option<String>,
    pub(crate) cancel: Option<CancellationToken>,
    /// A bookmark this call must be at least as fresh as, beside the session's (reads only).
    pub(crate) bookmark: Option<Bookmark>,
    /// Which server may answer (reads only); `None` is [`Consistency::Session`].
    pub(crate) consistency: Option<Consistency>,
    /// Whether this read is hedged; `None` is the client's setting (verified reads only).
    pub(crate) hedge: Option<bool>,
}

impl CallOptions {
    /// Checks the overrides before anything is sent, as `ClientBuilder::build` checks the client's.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.timeout == Some(Some(Duration::ZERO)) {
            return Err(Error::config("the call's timeout must be larger than zero"));
        }
        if let Some(policy) = &self.retry {
            policy
                .validate()
                .map_err(|message| Error::config(format!("the call's retry policy: {message}")))?;
        }
        if let Some(key) = &self.idempotency_key {
            check_key(key).map_err(Error::config)?;
        }
        Ok(())
    }
}

/// The protocol's rule for a key: 1 to 255 visible ASCII characters.
pub(crate) fn check_key(key: &str) -> std::result::Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(format!(
            "an idempotency key is 1 to {MAX_KEY_LEN} characters, this one is {}",
            key.len()
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "an idempotency key is visible ASCII only (no spaces or control characters)".to_owned(),
        );
    }
    Ok(())
}

impl fmt::Debug for CallOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CallOptions");
        if let Some(timeout) = &self.timeout {
            d.field("timeout", timeout);
        }
        if let Some(retry) = &self.retry {
            d.field("retry", retry);
        }
        if let Some(retry_writes) = &self.retry_writes {
            d.field("retry_writes", retry_writes);
        }
        if let Some(key) = &self.idempotency_key {
            d.field("idempotency_key", key);
        }
        if let Some(bookmark) = &self.bookmark {
            d.field("bookmark", bookmark);
        }
        if let Some(consistency) = &self.consistency {
            d.field("consistency", consistency);
        }
        if let Some(hedge) = &self.hedge {
            d.field("hedge", hedge);
        }
        d.field("cancellable", &self.cancel.is_some()).finish()
    }
}

/// `.timeout` and `.cancel_on`, for every request builder (a field `options: CallOptions`).
macro_rules! call_settings {
    (impl[$($generics:tt)*] $builder:ty) => {
        impl<$($generics)*> $builder {
            /// The budget of each attempt of this call, overriding
            /// [`ClientBuilder::timeout`](crate::ClientBuilder::timeout); `None` lets an attempt run as
            /// long as the server takes. A quick lookup and a long report can share one client.
            /// A zero timeout fails the call with [`ErrorKind::Config`](crate::ErrorKind::Config)
            /// before anything is sent.
            pub fn timeout(mut self, timeout: impl Into<Option<std::time::Duration>>) -> Self {
                self.options.timeout = Some(timeout.into());
                self
            }

            /// Cancels this call when `token` is cancelled: at once, mid-attempt or mid-backoff, with
            /// [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled). The client's own token, if any,
            /// applies as well. Cancelling stops the client, not the server: a statement already sent
            /// may still commit.
            pub fn cancel_on(mut self, token: &tokio_util::sync::CancellationToken) -> Self {
                self.options.cancel = Some(token.clone());
                self
            }
        }
    };
}

/// `.retry`, for the builders whose class may be retried (reads and writes; never `execute`).
macro_rules! retry_setting {
    (impl[$($generics:tt)*] $builder:ty) => {
        impl<$($generics)*> $builder {
            /// Attempts, backoff and the elapsed-time ceiling of this call, overriding
            /// [`ClientBuilder::retry`](crate::ClientBuilder::retry) (the client's retry budget still
            /// applies). A policy that cannot work fails the call with
            /// [`ErrorKind::Config`](crate::ErrorKind::Config) before anything is sent.
            pub fn retry(mut self, policy: crate::RetryPolicy) -> Self {
                self.options.retry = Some(policy);
                self
            }
        }
    };
}

/// `.retry_writes` and `.idempotency_key`, for write builders.
macro_rules! write_settings {
    (impl[$($generics:tt)*] $builder:ty) => {
        impl<$($generics)*> $builder {
            /// Retries this write on transient failures, overriding
            /// [`ClientBuilder::retry_writes`](crate::ClientBuilder::retry_writes). Safe against a
            /// server that honours idempotency keys (the reference server does); against one that
            /// ignores them, a write whose response was lost is applied twice when retried.
            pub fn retry_writes(mut self, enabled: bool) -> Self {
                self.options.retry_writes = Some(enabled);
                self
            }

            /// A key of the caller's own for this write, instead of one the SDK makes per call.
            ///
            /// The same key with the same rows is one effect, across calls and processes (within the
            /// server's key lifetime, 24 h for the reference server): store the key with the work
            /// before sending, and after a crash, a timeout or an error whose outcome is unknown
            /// ([`Error::is_outcome_unknown`](crate::Error::is_outcome_unknown)), send it again with
            /// the same key. A statement that committed is replayed, not run again. The same key with
            /// different rows is refused (`422 IDEMPOTENCY_KEY_REUSED`).
            ///
            /// A key is 1 to 255 visible ASCII characters (the protocol's rule); another fails the
            /// call with [`ErrorKind::Config`](crate::ErrorKind::Config) before anything is sent.
            pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
                self.options.idempotency_key = Some(key.into());
                self
            }
        }
    };
}

/// `.bookmark` and `.consistency`, for the builders of reads (and batches: a read-only one is a read).
macro_rules! read_settings {
    (impl[$($generics:tt)*] $builder:ty) => {
        impl<$($generics)*> $builder {
            /// Makes this call's answer at least as fresh as `bookmark` too (one handed over from
            /// another process, say), beside the client's own session: the request carries the
            /// greater of the two. The client's session is not raised by it, only by the bookmark
            /// the answer carries. `None` adds nothing. Not sent under
            /// [`Consistency::AnyReplica`](crate::Consistency::AnyReplica).
            pub fn bookmark(mut self, bookmark: impl Into<Option<crate::Bookmark>>) -> Self {
                self.options.bookmark = bookmark.into();
                self
            }

            /// Which server may answer this read and how fresh it must be (default
            /// [`Consistency::Session`](crate::Consistency::Session): it reads the client's own
            /// writes). Writes go to the primary whatever this says.
            pub fn consistency(mut self, consistency: crate::Consistency) -> Self {
                self.options.consistency = Some(consistency);
                self
            }

            /// Hedges this read (`true`) or not (`false`), overriding
            /// [`ClientBuilder::hedge_reads`](crate::ClientBuilder::hedge_reads); `true` on a
            /// client without a hedge policy uses [`HedgePolicy::new()`](crate::HedgePolicy::new).
            /// A read not answered after the policy's delay is sent again on another connection,
            /// and the first answer wins. Only verified reads are ever hedged: on a batch that is
            /// not [`read_only`](crate::Batch::read_only) this does nothing.
            pub fn hedge(mut self, enabled: bool) -> Self {
                self.options.hedge = Some(enabled);
                self
            }
        }
    };
}

pub(crate) use {call_settings, read_settings, retry_setting, write_settings};
