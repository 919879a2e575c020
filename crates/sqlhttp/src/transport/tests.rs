//! The retry loop driven through a scripted exchange on tokio's paused clock: no sockets, so every
//! timer in play is the loop's own and every figure is exact.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::exchange::ExchangeFuture;
use super::*;
use crate::retry::{Jitter, RetryBudget};

/// What the scripted server does for one attempt.
#[derive(Clone)]
enum Step {
    Ok,
    Fail(ErrorKind),
    /// Fails before the request left the client (a refused connect, a DNS failure).
    NotSent(ErrorKind),
    /// A failed response that carried this `X-Request-Id`.
    FailWithId(ErrorKind, &'static str),
    /// Answers after this long.
    Slow(Duration),
    /// Fails after this long.
    SlowFail(Duration, ErrorKind),
    /// Never answers.
    Hang,
    /// Fails after this long as the HTTP client's own timeout does (no duration).
    TimesOut(Duration),
    /// Answers at once with a body whose pieces arrive each after its pause.
    Trickle(Vec<Duration>),
}

/// What one attempt looked like from the server's side.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    at: Duration,
    attempt: String,
    key: Option<String>,
    bookmark: Option<crate::Bookmark>,
}

struct Scripted {
    steps: Mutex<VecDeque<Step>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    epoch: Instant,
}

impl Exchange for Scripted {
    fn send<'a>(&'a self, request: AttemptRequest<'a>) -> ExchangeFuture<'a> {
        self.seen.lock().unwrap().push(Seen {
            at: self.epoch.elapsed(),
            attempt: format!("{}/{}", request.attempt, request.max_attempts),
            key: request
                .idempotency_key
                .map(|k| k.to_str().unwrap().to_owned()),
            bookmark: request.bookmark,
        });
        let step = self.steps.lock().unwrap().pop_front().unwrap_or(Step::Ok);
        Box::pin(async move {
            match step {
                Step::Ok => Ok(Bytes::from_static(b"ok").into()),
                Step::Fail(kind) => Err(kind.into()),
                Step::FailWithId(kind, id) => Err(Failure {
                    request_id: Some(id.to_owned()),
                    ..kind.into()
                }),
                Step::NotSent(kind) => Err(Failure {
                    kind,
                    sent: false,
                    source: Some("connection refused (os error 111)".into()),
                    statement: None,
                    request_id: None,
                }),
                Step::Slow(after) => {
                    tokio::time::sleep(after).await;
                    Ok(Bytes::from_static(b"ok").into())
                }
                Step::SlowFail(after, kind) => {
                    tokio::time::sleep(after).await;
                    Err(kind.into())
                }
                Step::Hang => std::future::pending().await,
                Step::Trickle(pauses) => Ok(Body::scripted(
                    pauses
                        .into_iter()
                        .map(|pause| (pause, Bytes::from_static(b"ok"))),
                )),
                Step::TimesOut(after) => {
                    tokio::time::sleep(after).await;
                    Err(ErrorKind::Timeout {
                        after: Duration::ZERO,
                    }
                    .into())
                }
            }
        })
    }
}

/// Takes the whole body.
#[derive(Default)]
struct Whole(Vec<u8>);

impl Receive for Whole {
    fn reset(&mut self) {
        self.0.clear();
    }

    fn take(&mut self, piece: Option<&[u8]>) -> Result<bool, Failure> {
        match piece {
            Some(piece) => {
                self.0.extend_from_slice(piece);
                Ok(false)
            }
            None => Ok(true),
        }
    }
}

struct Harness {
    transport: Transport,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Harness {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self::with(steps, |t| t)
    }

    fn with(
        steps: impl IntoIterator<Item = Step>,
        configure: impl FnOnce(Transport) -> Transport,
    ) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let transport = Transport {
            exchange: Box::new(Scripted {
                steps: Mutex::new(steps.into_iter().collect()),
                seen: seen.clone(),
                epoch: Instant::now(),
            }),
            timeout: None,
            policy: RetryPolicy::new().with_jitter(Jitter::None),
            retry_writes: false,
            budget: Some(TokenBucket::new(RetryBudget::new())),
            rate: None,
            hedging: Default::default(),
            rng: Mutex::new(Transport::new_rng(Some(1))),
            cancel: None,
            session: Arc::default(),
            trace: Default::default(),
            metrics: Default::default(),
        };
        Self {
            transport: configure(transport),
            seen,
        }
    }

    async fn send(&self, class: OpClass) -> Result<Bytes> {
        self.send_with(class, None).await
    }

    async fn send_with(&self, class: OpClass, cancel: Option<&CancellationToken>) -> Result<Bytes> {
        let options = CallOptions {
            cancel: cancel.cloned(),
            ..CallOptions::default()
        };
        self.deliver_bytes(class, &options, None)
            .await
            .map(|(_, bytes)| bytes)
    }

    async fn deliver(
        &self,
        class: OpClass,
        cancel: Option<&CancellationToken>,
    ) -> Result<Delivered> {
        let options = CallOptions {
            cancel: cancel.cloned(),
            ..CallOptions::default()
        };
        self.deliver_with(class, &options, None).await
    }

    async fn deliver_with(
        &self,
        class: OpClass,
        options: &CallOptions,
        key: Option<&'static str>,
    ) -> Result<Delivered> {
        self.deliver_bytes(class, options, key)
            .await
            .map(|(delivered, _)| delivered)
    }

    /// Sends, taking the whole body as the receiver.
    async fn deliver_bytes(
        &self,
        class: OpClass,
        options: &CallOptions,
        key: Option<&'static str>,
    ) -> Result<(Delivered, Bytes)> {
        let mut whole = Whole::default();
        let delivered = self
            .transport
            .send(
                Call {
                    class,
                    endpoint: Endpoint::Sql,
                    body: Bytes::from_static(b"{}"),
                    sql: "SELECT 1",
                    options,
                    idempotency_key: key.map(HeaderValue::from_static),
                    started: None,
                },
                &mut whole,
            )
            .await?;
        Ok((delivered, Bytes::from(whole.0)))
    }

    /// Sends with per-call settings, as a request builder does.
    async fn send_options(&self, class: OpClass, options: CallOptions) -> Result<Bytes> {
        self.deliver_bytes(class, &options, None)
            .await
            .map(|(_, bytes)| bytes)
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.seen().into_iter().map(|s| s.key).collect()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn times(&self) -> Vec<Duration> {
        self.seen().into_iter().map(|s| s.at).collect()
    }
}

fn unavailable() -> Step {
    Step::Fail(ErrorKind::Unavailable {
        retry_after: None,
        message: String::new(),
    })
}

fn status(status: u16) -> Step {
    Step::Fail(ErrorKind::Http {
        status,
        code: None,
        message: String::new(),
    })
}

fn waiting(secs: u64) -> Step {
    Step::Fail(ErrorKind::RateLimited {
        retry_after: Some(Duration::from_secs(secs)),
        message: String::new(),
    })
}

impl Step {
    fn kind(self) -> ErrorKind {
        match self {
            Step::Fail(kind) => kind,
            _ => unreachable!("a failing step"),
        }
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[tokio::test(start_paused = true)]
async fn reads_retry_with_doubling_backoff_and_succeed() {
    let h = Harness::new([unavailable(), unavailable(), Step::Ok]);
    assert_eq!(h.send(OpClass::Read).await.unwrap(), "ok");
    assert_eq!(h.times(), vec![ms(0), ms(100), ms(300)]);
    let attempts: Vec<_> = h.seen().into_iter().map(|s| s.attempt).collect();
    assert_eq!(attempts, vec!["1/3", "2/3", "3/3"]);
}

#[tokio::test(start_paused = true)]
async fn writes_retry_only_when_allowed_and_keep_one_key() {
    let h = Harness::new([unavailable(), Step::Ok]);
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(h.seen()[0].attempt, "1/1");

    let h = Harness::with([unavailable(), unavailable(), Step::Ok], |mut t| {
        t.retry_writes = true;
        t
    });
    h.send(OpClass::Write).await.unwrap();
    let keys: Vec<_> = h.seen().into_iter().map(|s| s.key.unwrap()).collect();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k == &keys[0] && k.len() == 32));
}

#[tokio::test(start_paused = true)]
async fn reads_and_executes_carry_no_key() {
    for class in [OpClass::Read, OpClass::Execute] {
        let h = Harness::new([Step::Ok]);
        h.send(class).await.unwrap();
        assert_eq!(h.seen()[0].key, None);
    }
}

#[tokio::test(start_paused = true)]
async fn execute_is_never_retried() {
    let h = Harness::with([unavailable(), Step::Ok], |mut t| {
        t.retry_writes = true;
        t.policy = t.policy.with_max_attempts(10);
        t
    });
    let err = h.send(OpClass::Execute).await.unwrap_err();
    assert_eq!((err.attempts(), h.seen().len()), (1, 1));
    assert_eq!(h.seen()[0].attempt, "1/1");
}

#[tokio::test(start_paused = true)]
async fn final_failures_end_the_sequence() {
    for step in [status(501), status(400), status(404)] {
        let h = Harness::new([step, Step::Ok]);
        assert_eq!(h.send(OpClass::Read).await.unwrap_err().attempts(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_failure_propagates_with_its_history() {
    let h = Harness::new([status(500), status(502), status(504), Step::Ok]);
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!((err.status(), err.attempts()), (Some(504), 3));
    let history: Vec<_> = err
        .history()
        .iter()
        .map(|a| (a.attempt, a.status, a.retry_delay))
        .collect();
    assert_eq!(
        history,
        vec![
            (1, Some(500), Some(ms(100))),
            (2, Some(502), Some(ms(200))),
            (3, Some(504), None)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_wins_over_the_computed_delay_but_is_capped() {
    let h = Harness::new([waiting(2), waiting(30), Step::Ok]);
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(
        h.times(),
        vec![ms(0), ms(2_000), ms(9_000)],
        "2 s asked; 30 s held to the computed 2 s plus 5 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_retry_after_retries_at_once() {
    let h = Harness::new([waiting(0), Step::Ok]);
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(0)]);
}

#[tokio::test(start_paused = true)]
async fn full_jitter_stays_under_the_ceiling_and_repeats_with_the_seed() {
    let run = || async {
        let h = Harness::with(std::iter::repeat_n(unavailable(), 6), |mut t| {
            t.policy = t.policy.with_max_attempts(6).with_jitter(Jitter::Full);
            t.rng = Mutex::new(Transport::new_rng(Some(5)));
            t
        });
        let err = h.send(OpClass::Read).await.unwrap_err();
        err.history()
            .iter()
            .filter_map(|a| a.retry_delay)
            .collect::<Vec<_>>()
    };
    let delays = run().await;
    assert_eq!(delays, run().await);
    let ceilings: Vec<_> = (0..delays.len())
        .map(|n| ms(100 * (1 << n)).min(ms(5_000)))
        .collect();
    for (n, (delay, ceiling)) in delays.iter().zip(&ceilings).enumerate() {
        assert!(delay <= ceiling, "retry {n}: {delay:?} > {ceiling:?}");
    }
    assert_ne!(delays, ceilings, "full jitter draws below the ceiling");
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_refuses_a_sleep_that_would_end_past_it() {
    let h = Harness::with(std::iter::repeat_n(unavailable(), 10), |mut t| {
        t.policy = t
            .policy
            .with_max_attempts(10)
            .with_initial_backoff(ms(1_000))
            .with_max_backoff(ms(1_000))
            .with_max_elapsed(ms(2_500));
        t
    });
    let started = Instant::now();
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(started.elapsed(), ms(2_000));
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable { .. }),
        "the last failure, not a timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn no_attempt_runs_past_max_elapsed() {
    let h = Harness::with([unavailable(), Step::Hang], |mut t| {
        t.timeout = Some(ms(10_000));
        t.policy = t.policy.with_max_elapsed(ms(1_000));
        t
    });
    let started = Instant::now();
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::Timeout { after: ms(900) });
    assert_eq!(started.elapsed(), ms(1_000));
    assert_eq!(err.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_gets_the_whole_timeout() {
    let h = Harness::with([Step::Hang, Step::Slow(ms(1_500)), Step::Ok], |mut t| {
        t.timeout = Some(ms(1_000));
        t
    });
    let started = Instant::now();
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(1_100), ms(2_300)]);
    assert_eq!(started.elapsed(), ms(2_300));
}

#[tokio::test(start_paused = true)]
async fn a_slow_success_within_the_timeout_is_a_success() {
    let h = Harness::with([Step::Slow(ms(900))], |mut t| {
        t.timeout = Some(ms(1_000));
        t
    });
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_mid_backoff_returns_at_once() {
    let h = Harness::new([waiting(30), Step::Ok]);
    let token = CancellationToken::new();
    let started = Instant::now();
    let (result, ()) = tokio::join!(h.send_with(OpClass::Read, Some(&token)), async {
        tokio::time::sleep(ms(1_000)).await;
        token.cancel();
    });
    let err = result.unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::Cancelled, 1));
    // 30 s asked, held to the computed 1 s plus 5 s.
    assert_eq!(err.history()[0].retry_delay, Some(ms(6_000)));
    assert_eq!(started.elapsed(), ms(1_000));
    assert_eq!(h.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_mid_attempt_returns_at_once() {
    let h = Harness::new([Step::Hang]);
    let token = CancellationToken::new();
    let started = Instant::now();
    let (result, ()) = tokio::join!(h.send_with(OpClass::Execute, Some(&token)), async {
        tokio::time::sleep(ms(250)).await;
        token.cancel();
    });
    assert_eq!(result.unwrap_err().kind(), &ErrorKind::Cancelled);
    assert_eq!(started.elapsed(), ms(250));
}

#[tokio::test(start_paused = true)]
async fn the_clients_token_cancels_too() {
    let client_token = CancellationToken::new();
    let h = Harness::with([unavailable(), Step::Hang], |mut t| {
        t.cancel = Some(client_token.clone());
        t
    });
    let call_token = CancellationToken::new();
    let started = Instant::now();
    let (result, ()) = tokio::join!(h.send_with(OpClass::Read, Some(&call_token)), async {
        tokio::time::sleep(ms(500)).await;
        client_token.cancel();
    });
    let err = result.unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::Cancelled, 2));
    assert_eq!(started.elapsed(), ms(500));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_token_sends_nothing() {
    let h = Harness::new([Step::Ok]);
    let token = CancellationToken::new();
    token.cancel();
    let err = h.send_with(OpClass::Read, Some(&token)).await.unwrap_err();
    assert_eq!((err.kind(), err.attempts()), (&ErrorKind::Cancelled, 0));
    assert!(h.seen().is_empty());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_stops_every_attempt() {
    let h = Harness::new(std::iter::repeat_n(unavailable(), 10));
    let outcome = tokio::time::timeout(ms(150), h.send(OpClass::Read)).await;
    assert!(outcome.is_err());
    assert_eq!(h.seen().len(), 2, "attempts at 0 and 100 ms");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(h.seen().len(), 2, "nothing runs once the future is gone");
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_returns_the_failure_and_says_so() {
    let h = Harness::with(std::iter::repeat_n(unavailable(), 10), |mut t| {
        t.policy = t.policy.with_max_attempts(10);
        t.budget = Some(TokenBucket::new(RetryBudget::new().with_capacity(15)));
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(
        err.attempts(),
        2,
        "15 tokens pay for one retry after a failure, at 14"
    );
    assert!(err.is_budget_exhausted());
    let last = err.history().last().unwrap();
    assert_eq!(last.retry_delay, None);
    let state = err.retry_state().expect("the budget refused it");
    assert_eq!((state.tokens(), state.capacity()), (Some(1), Some(15)));
    assert_eq!(h.transport.retry_state(), state);
}

#[tokio::test(start_paused = true)]
async fn successes_refill_the_budget() {
    let h = Harness::with(
        [
            unavailable(),
            unavailable(),
            Step::Ok,
            unavailable(),
            Step::Ok,
        ],
        |mut t| {
            t.budget = Some(TokenBucket::new(
                RetryBudget::new()
                    .with_capacity(5)
                    .with_retry_cost(5)
                    .with_success_deposit(5),
            ));
            t
        },
    );
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.attempts(), 2);
    h.send(OpClass::Read).await.unwrap();
    assert!(
        h.send(OpClass::Read).await.is_ok(),
        "the deposit paid for this retry"
    );
    assert_eq!(h.transport.budget.as_ref().unwrap().tokens(), 5);
}

#[tokio::test(start_paused = true)]
async fn timeouts_pay_the_timeout_cost() {
    let h = Harness::with([Step::Hang, Step::Hang, Step::Ok], |mut t| {
        t.timeout = Some(ms(100));
        t.budget = Some(TokenBucket::new(RetryBudget::new().with_capacity(15)));
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(
        err.attempts(),
        2,
        "one timeout retry (14) paid, the second refused"
    );
    assert!(err.is_timeout() && err.is_budget_exhausted());
}

#[tokio::test(start_paused = true)]
async fn a_success_reports_its_attempts_and_history() {
    let h = Harness::new([unavailable(), status(502), Step::Ok]);
    let delivered = h.deliver(OpClass::Read, None).await.unwrap();
    assert_eq!(delivered.attempts, 3);
    let statuses: Vec<_> = delivered.history.iter().map(|a| a.status).collect();
    assert_eq!(statuses, vec![Some(503), Some(502)]);
    let err = delivered.attach(Error::new(ErrorKind::RowNotFound));
    assert_eq!(err.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_unrepresentable_max_elapsed_is_no_ceiling() {
    let h = Harness::with([unavailable(), unavailable(), Step::Ok], |mut t| {
        t.policy = t.policy.with_max_elapsed(Duration::MAX);
        t.timeout = Some(Duration::MAX);
        t
    });
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.seen().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_retry_cancelled_in_its_backoff_is_refunded() {
    let h = Harness::with([waiting(30), Step::Ok], |mut t| {
        t.budget = Some(TokenBucket::new(RetryBudget::new().with_capacity(20)));
        t
    });
    let token = CancellationToken::new();
    let (result, ()) = tokio::join!(h.send_with(OpClass::Read, Some(&token)), async {
        tokio::time::sleep(ms(10)).await;
        assert_eq!(
            h.transport.budget.as_ref().unwrap().tokens(),
            15,
            "paid while sleeping"
        );
        token.cancel();
    });
    assert_eq!(result.unwrap_err().kind(), &ErrorKind::Cancelled);
    assert_eq!(h.transport.budget.as_ref().unwrap().tokens(), 20);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_of_the_http_clients_own_says_how_long_it_took() {
    // A caller-supplied reqwest client with its own timeout reports it without a duration.
    let h = Harness::with([Step::TimesOut(ms(750))], |mut t| {
        t.policy = RetryPolicy::never();
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::Timeout { after: ms(750) });
}

#[tokio::test(start_paused = true)]
async fn a_write_meeting_its_own_key_in_use_is_retried_with_that_key() {
    let h = Harness::with([key_in_use(None), Step::Ok], |mut t| {
        t.retry_writes = true;
        t
    });
    h.send(OpClass::Write).await.unwrap();
    let seen = h.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].key, seen[1].key);
}

#[tokio::test(start_paused = true)]
async fn connection_failures_and_timeouts_are_retried_for_reads() {
    let refused = Step::Fail(ErrorKind::Connection {
        message: "refused".into(),
    });
    let timed_out = Step::Fail(ErrorKind::Timeout { after: ms(5) });
    let h = Harness::new([refused, timed_out, Step::Ok]);
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.seen().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn retry_after_on_a_503_is_honoured_too() {
    let busy = Step::Fail(ErrorKind::Unavailable {
        retry_after: Some(Duration::from_secs(3)),
        message: String::new(),
    });
    let h = Harness::new([busy, Step::Ok]);
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(3_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_certificate_failure_is_final() {
    let tls = Step::Fail(ErrorKind::Tls {
        message: "invalid peer certificate".into(),
    });
    let h = Harness::new([tls, Step::Ok]);
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!((err.attempts(), h.seen().len()), (1, 1));
}

fn key_in_use(retry_after_secs: Option<u64>) -> Step {
    Step::Fail(ErrorKind::IdempotencyKeyInUse {
        retry_after: retry_after_secs.map(Duration::from_secs),
        message: String::new(),
    })
}

fn refused() -> Step {
    Step::NotSent(ErrorKind::Connection {
        message: "connection refused".into(),
    })
}

fn retrying_writes() -> impl FnOnce(Transport) -> Transport {
    |mut t| {
        t.retry_writes = true;
        t
    }
}

#[tokio::test(start_paused = true)]
async fn key_in_use_waits_for_its_retry_after_held_to_the_computed_delay_plus_5_s() {
    // The bug: a 409 in use was retried after 0-100 ms, so a slow first attempt outlived them all.
    let h = Harness::with(
        [key_in_use(Some(1)), key_in_use(Some(30)), Step::Ok],
        retrying_writes(),
    );
    h.send(OpClass::Write).await.unwrap();
    assert_eq!(
        h.times(),
        vec![ms(0), ms(1_000), ms(8_000)],
        "1 s asked; 30 s held to the computed 2 s plus 5 s"
    );
    let keys = h.keys();
    assert!(
        keys.iter().all(|k| k.is_some() && *k == keys[0]),
        "{keys:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn key_in_use_without_retry_after_falls_back_to_the_throttle_backoff() {
    let h = Harness::with([key_in_use(None), Step::Ok], retrying_writes());
    h.send(OpClass::Write).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(1_000)], "a throttle's base, 1 s");
}

#[tokio::test(start_paused = true)]
async fn a_write_out_of_attempts_while_its_key_is_in_use_says_the_outcome_is_unknown() {
    let h = Harness::with(
        [Step::Hang, key_in_use(Some(1)), key_in_use(Some(1))],
        |mut t| {
            t.retry_writes = true;
            t.timeout = Some(ms(500));
            t
        },
    );
    let err = h
        .deliver_with(OpClass::Write, &CallOptions::default(), Some("order-7"))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::IdempotencyKeyInUse { .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 3);
    assert!(err.is_sent() && err.is_outcome_unknown(), "{err:?}");
    assert_eq!(err.idempotency_key(), Some("order-7"));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    let text = err.to_string();
    assert!(
        text.contains("outcome unknown") && text.contains("order-7"),
        "{text}"
    );
    assert_eq!(
        h.keys(),
        vec![Some("order-7".to_owned()); 3],
        "the caller's key on every attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_that_timed_out_has_an_unknown_outcome_and_carries_its_key() {
    let h = Harness::with([Step::Hang], |mut t| {
        t.timeout = Some(ms(200));
        t
    });
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert!(err.is_timeout() && err.is_sent() && err.is_outcome_unknown());
    let sent_key = h.keys()[0].clone().unwrap();
    assert_eq!(err.idempotency_key(), Some(sent_key.as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_final_answer_after_an_unanswered_attempt_settles_the_outcome() {
    let constraint = Step::Fail(ErrorKind::ConstraintViolation {
        constraint: Some(crate::ConstraintKind::Unique),
        message: String::new(),
    });
    let h = Harness::with([Step::Hang, constraint], |mut t| {
        t.retry_writes = true;
        t.timeout = Some(ms(200));
        t
    });
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert_eq!(err.attempts(), 2);
    assert!(err.is_sent() && !err.is_outcome_unknown(), "{err:?}");
    assert!(!err.to_string().contains("outcome unknown"));
}

#[tokio::test(start_paused = true)]
async fn a_503_after_an_unanswered_attempt_leaves_the_outcome_unknown() {
    let h = Harness::with([Step::Hang, unavailable()], |mut t| {
        t.retry_writes = true;
        t.timeout = Some(ms(200));
        t.policy = t.policy.with_max_attempts(2);
        t
    });
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Unavailable { .. }));
    assert!(err.is_outcome_unknown(), "attempt 1 may have committed");
}

#[tokio::test(start_paused = true)]
async fn refused_connections_sent_nothing() {
    let h = Harness::with([refused(), refused(), refused()], retrying_writes());
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert!(!err.is_sent() && !err.is_outcome_unknown(), "{err:?}");
    assert_eq!(
        err.idempotency_key(),
        None,
        "nothing to re-send under a key"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the network stack's error is kept"
    );
}

#[tokio::test(start_paused = true)]
async fn one_sent_attempt_makes_the_call_sent() {
    let h = Harness::with([Step::Hang, refused()], |mut t| {
        t.retry_writes = true;
        t.timeout = Some(ms(100));
        t.policy = t.policy.with_max_attempts(2);
        t
    });
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert!(
        err.is_connection() && err.is_sent() && err.is_outcome_unknown(),
        "{err:?}"
    );
    assert!(err.idempotency_key().is_some());
}

#[tokio::test(start_paused = true)]
async fn reads_and_executes_never_claim_a_key_and_reads_never_an_unknown_outcome() {
    let h = Harness::with([Step::Hang], |mut t| {
        t.timeout = Some(ms(100));
        t.policy = RetryPolicy::never();
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(err.is_sent() && !err.is_outcome_unknown() && err.idempotency_key().is_none());
    let h = Harness::with([Step::Hang], |mut t| {
        t.timeout = Some(ms(100));
        t
    });
    let err = h.send(OpClass::Execute).await.unwrap_err();
    assert!(
        err.is_outcome_unknown() && err.idempotency_key().is_none(),
        "{err:?}"
    );
    assert!(err.to_string().contains("may have been applied"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn per_call_settings_win_over_the_clients() {
    // The client: 3 attempts, a 10 s timeout, writes not retried.
    let client_side = |mut t: Transport| {
        t.timeout = Some(ms(10_000));
        t
    };
    // A per-call timeout.
    let h = Harness::with([Step::Hang, Step::Ok], client_side);
    let started = Instant::now();
    let options = CallOptions {
        timeout: Some(Some(ms(250))),
        ..CallOptions::default()
    };
    h.send_options(OpClass::Read, options).await.unwrap();
    assert_eq!(
        h.times(),
        vec![ms(0), ms(350)],
        "250 ms timeout, 100 ms backoff"
    );
    assert_eq!(started.elapsed(), ms(350));

    // A per-call policy: five attempts where the client allows three.
    let h = Harness::with(std::iter::repeat_n(unavailable(), 10), client_side);
    let options = CallOptions {
        retry: Some(
            RetryPolicy::new()
                .with_max_attempts(5)
                .with_jitter(Jitter::None),
        ),
        ..CallOptions::default()
    };
    let err = h.send_options(OpClass::Read, options).await.unwrap_err();
    assert_eq!(err.attempts(), 5);
    assert_eq!(h.seen()[4].attempt, "5/5");

    // A per-call `retry_writes`.
    let h = Harness::with([unavailable(), Step::Ok], client_side);
    let options = CallOptions {
        retry_writes: Some(true),
        ..CallOptions::default()
    };
    h.send_options(OpClass::Write, options).await.unwrap();
    assert_eq!(h.seen().len(), 2);

    // And `retry_writes(false)` on a call turns the client's `true` off.
    let h = Harness::with([unavailable(), Step::Ok], retrying_writes());
    let options = CallOptions {
        retry_writes: Some(false),
        ..CallOptions::default()
    };
    let err = h.send_options(OpClass::Write, options).await.unwrap_err();
    assert_eq!(err.attempts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_per_call_timeout_of_none_lets_a_slow_attempt_finish() {
    let h = Harness::with([Step::Slow(ms(60_000))], |mut t| {
        t.timeout = Some(ms(1_000));
        t
    });
    let options = CallOptions {
        timeout: Some(None),
        ..CallOptions::default()
    };
    h.send_options(OpClass::Read, options).await.unwrap();
    assert_eq!(h.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_per_call_seed_repeats_its_delays() {
    let run = || async {
        let h = Harness::with(std::iter::repeat_n(unavailable(), 4), |t| t);
        let options = CallOptions {
            retry: Some(RetryPolicy::new().with_max_attempts(4).with_jitter_seed(99)),
            ..CallOptions::default()
        };
        let err = h.send_options(OpClass::Read, options).await.unwrap_err();
        err.history()
            .iter()
            .filter_map(|a| a.retry_delay)
            .collect::<Vec<_>>()
    };
    let delays = run().await;
    assert_eq!(delays.len(), 3);
    assert_eq!(delays, run().await);
}

#[tokio::test(start_paused = true)]
async fn execute_stays_one_attempt_whatever_the_call_says() {
    let h = Harness::with([unavailable(), Step::Ok], |t| t);
    let options = CallOptions {
        retry: Some(RetryPolicy::new().with_max_attempts(10)),
        retry_writes: Some(true),
        ..CallOptions::default()
    };
    let err = h.send_options(OpClass::Execute, options).await.unwrap_err();
    assert_eq!((err.attempts(), h.seen().len()), (1, 1));
    assert_eq!(h.seen()[0].attempt, "1/1");
    assert_eq!(h.seen()[0].key, None);
}

#[tokio::test(start_paused = true)]
async fn a_connect_timeout_sent_nothing_and_says_how_long_it_took() {
    let connect_timeout = Step::NotSent(ErrorKind::Timeout {
        after: Duration::ZERO,
    });
    let h = Harness::with([connect_timeout], |mut t| {
        t.policy = RetryPolicy::never();
        t
    });
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert!(err.is_timeout() && !err.is_sent() && !err.is_outcome_unknown());
}

#[tokio::test(start_paused = true)]
async fn each_attempt_keeps_the_request_id_its_response_carried() {
    let harness = Harness::new([
        Step::FailWithId(
            ErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(1)),
                message: String::new(),
            },
            "first-id",
        ),
        Step::Fail(ErrorKind::Timeout { after: ms(5) }),
        Step::FailWithId(
            ErrorKind::Unavailable {
                retry_after: None,
                message: String::new(),
            },
            "third-id",
        ),
    ]);
    let err = harness.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.request_id(), Some("third-id"));
    let ids: Vec<Option<&str>> = err
        .history()
        .iter()
        .map(|failure| failure.request_id.as_deref())
        .collect();
    assert_eq!(ids, [Some("first-id"), None, Some("third-id")]);
    assert!(format!("{err:?}").contains("third-id"));

    // A last attempt without a response has no id, whatever the earlier ones had.
    let harness = Harness::new([
        Step::FailWithId(status(500).kind(), "only-id"),
        Step::Fail(ErrorKind::Timeout { after: ms(5) }),
        Step::Fail(ErrorKind::Timeout { after: ms(5) }),
    ]);
    let err = harness.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.request_id(), None);
    assert_eq!(err.history()[0].request_id.as_deref(), Some("only-id"));
}

/// `timeout` bounds each stall of the body, not the whole download: ten pieces 900 ms apart under a
/// one-second timeout are nine seconds of healthy transfer.
#[tokio::test(start_paused = true)]
async fn a_long_body_that_keeps_arriving_is_not_cut() {
    let h = Harness::with([Step::Trickle(vec![ms(900); 10])], |t| Transport {
        timeout: Some(ms(1_000)),
        ..t
    });
    let started = Instant::now();
    let body = h.send(OpClass::Read).await.unwrap();
    assert_eq!(body.len(), 20);
    assert_eq!(started.elapsed(), ms(9_000));
    assert_eq!(h.seen().len(), 1);
}

/// A body that stalls past `timeout` before the call is served is an attempt timeout: retried.
#[tokio::test(start_paused = true)]
async fn a_body_stalled_before_the_call_is_served_is_retried() {
    let h = Harness::with([Step::Trickle(vec![ms(100), ms(1_500)]), Step::Ok], |t| {
        Transport {
            timeout: Some(ms(1_000)),
            ..t
        }
    });
    let started = Instant::now();
    let body = h.send(OpClass::Read).await.unwrap();
    assert_eq!(&body[..], b"ok");
    // The first piece at 100 ms, then a stall cut at 1 100 ms; the retry after its backoff.
    let times = h.times();
    assert_eq!(times.len(), 2);
    assert_eq!(times[0], ms(0));
    assert!(times[1] >= ms(1_100), "{times:?}");
    assert!(started.elapsed() >= ms(1_100));
}

fn outcome_unknown() -> Step {
    Step::Fail(ErrorKind::OutcomeUnknown {
        retry_after: None,
        message: String::new(),
    })
}

fn bookmark_ahead() -> Step {
    Step::Fail(ErrorKind::BookmarkAhead {
        message: String::new(),
    })
}

fn at(n: u64) -> crate::Bookmark {
    format!("{n:016x}").parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn outcome_unknown_is_retried_for_steps_and_keyed_writes_and_said_at_the_end() {
    let h = Harness::new([outcome_unknown(), Step::Ok]);
    h.send(OpClass::Step).await.unwrap();
    assert_eq!(h.seen().len(), 2);

    let h = Harness::new([outcome_unknown(), outcome_unknown(), outcome_unknown()]);
    let err = h.send(OpClass::Step).await.unwrap_err();
    assert_eq!(err.attempts(), 3);
    assert!(err.is_outcome_unknown(), "{err:?}");

    let h = Harness::with([outcome_unknown(), Step::Ok], retrying_writes());
    h.send(OpClass::Write).await.unwrap();
    assert_eq!(h.keys()[0], h.keys()[1]);

    // A settled answer before it does not settle it.
    let h = Harness::with(
        [unavailable(), unavailable(), outcome_unknown()],
        retrying_writes(),
    );
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert!(err.is_outcome_unknown(), "{err:?}");

    let h = Harness::with([outcome_unknown(), Step::Ok], retrying_writes());
    let err = h.send(OpClass::Execute).await.unwrap_err();
    assert_eq!(h.seen().len(), 1);
    assert!(err.is_outcome_unknown(), "{err:?}");

    let h = Harness::new(std::iter::repeat_n(outcome_unknown(), 3));
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(!err.is_outcome_unknown(), "never for a read: {err:?}");
}

#[tokio::test(start_paused = true)]
async fn a_bookmark_ahead_is_dropped_and_the_attempt_sent_again_at_once_without_it() {
    for class in [OpClass::Read, OpClass::Write, OpClass::Step] {
        let h = Harness::with([bookmark_ahead(), Step::Ok], |mut t| {
            t.session = Arc::new(crate::bookmark::Session::new(Some(at(900))));
            t.policy = RetryPolicy::never();
            t
        });
        h.send(class).await.unwrap();
        let seen = h.seen();
        assert_eq!(
            seen.iter()
                .map(|s| (s.at, s.attempt.as_str(), s.bookmark))
                .collect::<Vec<_>>(),
            [(ms(0), "1/1", Some(at(900))), (ms(0), "2/2", None)],
            "{class:?}"
        );
        assert_eq!(seen[0].key, seen[1].key, "{class:?}");
        assert_eq!(h.transport.session.get(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn a_bookmark_ahead_is_sent_again_once_and_an_execute_never() {
    // Refused again without one (the server's bug): the error, after one free attempt.
    let h = Harness::with([bookmark_ahead(), bookmark_ahead(), Step::Ok], |mut t| {
        t.session = Arc::new(crate::bookmark::Session::new(Some(at(900))));
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::BookmarkAhead { .. }),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 2);
    assert_eq!(err.history()[0].retry_delay, Some(Duration::ZERO));

    // Without a bookmark sent, the answer is the server's error as is.
    let h = Harness::new([bookmark_ahead(), Step::Ok]);
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.attempts(), 1, "{err:?}");

    let h = Harness::with([bookmark_ahead(), Step::Ok], |mut t| {
        t.session = Arc::new(crate::bookmark::Session::new(Some(at(900))));
        t
    });
    let err = h.send(OpClass::Execute).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::BookmarkAhead { .. }),
        "{err:?}"
    );
    assert!(!err.is_outcome_unknown(), "{err:?}");
    assert_eq!(h.seen().len(), 1);
    assert_eq!(
        h.transport.session.get(),
        None,
        "the next call goes without"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bookmark_ahead_at_max_elapsed_is_not_sent_again() {
    let refused_late = Step::SlowFail(ms(1_000), bookmark_ahead().kind());
    let h = Harness::with([refused_late, Step::Ok], |mut t| {
        t.session = Arc::new(crate::bookmark::Session::new(Some(at(900))));
        t.policy = t.policy.with_max_elapsed(ms(1_000));
        t.timeout = Some(ms(5_000));
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::BookmarkAhead { .. }),
        "{err:?}"
    );
    assert_eq!(h.seen().len(), 1);
    assert_eq!(h.transport.session.get(), None, "dropped all the same");
}

/// What each cause of a retry costs, and the adaptive send rate (issue 41).
mod load;

/// Hedged reads (issue 41).
mod hedging;
