//! [`RetryState`]: a snapshot of what a client's retry budget and adaptive send rate allow now, and
//! how many reads it hedged, for an application's dashboards and for the error of a call refused.
//!
//! A plain value read from the running state; it knows nothing of how that state changes.

/// What the client's retry budget and adaptive send rate allow at one moment, shared by every
/// clone of the client: from [`Client::retry_state`](crate::Client::retry_state), and on an error
/// the budget or the rate refused ([`Error::retry_state`](crate::Error::retry_state)).
///
/// ```
/// let client = sqlhttp::Client::builder("http://127.0.0.1:8080").build()?;
/// let state = client.retry_state();
/// assert_eq!(state.tokens(), Some(500), "a full bucket");
/// assert_eq!(state.capacity(), Some(500));
/// assert_eq!(state.send_rate(), None, "the adaptive rate is off");
/// assert_eq!(state.hedges_sent(), 0);
/// # Ok::<(), sqlhttp::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryState {
    pub(crate) budget: Option<(u32, u32)>,
    pub(crate) send_rate: Option<f64>,
    pub(crate) hedges_sent: u64,
}

impl RetryState {
    /// Tokens left in the retry budget, or `None` when the client retries without one.
    pub fn tokens(&self) -> Option<u32> {
        self.budget.map(|(tokens, _)| tokens)
    }

    /// Tokens the retry budget holds when full, or `None` when the client retries without one.
    pub fn capacity(&self) -> Option<u32> {
        self.budget.map(|(_, capacity)| capacity)
    }

    /// The attempts per second the adaptive send rate allows now, or `None` while it does not
    /// limit: it is off ([`ClientBuilder::adaptive_rate`](crate::ClientBuilder::adaptive_rate)), or
    /// the server has not throttled this client yet.
    pub fn send_rate(&self) -> Option<f64> {
        self.send_rate
    }

    /// Hedges sent since the client was built, by it and its clones
    /// ([`ClientBuilder::hedge_reads`](crate::ClientBuilder::hedge_reads)): second copies of reads
    /// that were slow to answer.
    pub fn hedges_sent(&self) -> u64 {
        self.hedges_sent
    }
}
