//! The retry loop driven through a scripted exchange on tokio's paused clock: no sockets, so every
//! timer in play is the loop's own and every figure is exact.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::retry::{Jitter, RetryBudget};

/// What the scripted server does for one attempt.
#[derive(Clone)]
enum Step {
    Ok,
    Fail(ErrorKind),
    /// Answers after this long.
    Slow(Duration),
    /// Never answers.
    Hang,
    /// Fails after this long as the HTTP client's own timeout does (no duration).
    TimesOut(Duration),
}

/// What one attempt looked like from the server's side.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    at: Duration,
    attempt: String,
    key: Option<String>,
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
        });
        let step = self.steps.lock().unwrap().pop_front().unwrap_or(Step::Ok);
        Box::pin(async move {
            match step {
                Step::Ok => Ok(Bytes::from_static(b"ok")),
                Step::Fail(kind) => Err(kind),
                Step::Slow(after) => {
                    tokio::time::sleep(after).await;
                    Ok(Bytes::from_static(b"ok"))
                }
                Step::Hang => std::future::pending().await,
                Step::TimesOut(after) => {
                    tokio::time::sleep(after).await;
                    Err(ErrorKind::Timeout {
                        after: Duration::ZERO,
                    })
                }
            }
        })
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
            policy: RetryPolicy::new().jitter(Jitter::None),
            retry_writes: false,
            budget: Some(TokenBucket::new(RetryBudget::new())),
            rng: Mutex::new(Transport::new_rng(Some(1))),
            cancel: None,
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
        self.deliver(class, cancel)
            .await
            .map(|delivered| delivered.body)
    }

    async fn deliver(
        &self,
        class: OpClass,
        cancel: Option<&CancellationToken>,
    ) -> Result<Delivered> {
        self.transport
            .send(Call {
                class,
                body: Bytes::from_static(b"{}"),
                sql: "SELECT 1",
                cancel,
                started: None,
            })
            .await
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
        t.policy = t.policy.max_attempts(10);
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
        vec![ms(0), ms(2_000), ms(7_000)],
        "2 s asked; 30 s capped to 5 s"
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
            t.policy = t.policy.max_attempts(6).jitter(Jitter::Full);
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
            .max_attempts(10)
            .initial_backoff(ms(1_000))
            .max_backoff(ms(1_000))
            .max_elapsed(ms(2_500));
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
        t.policy = t.policy.max_elapsed(ms(1_000));
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
    assert_eq!(err.history()[0].retry_delay, Some(ms(5_000)));
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
        t.policy = t.policy.max_attempts(10);
        t.budget = Some(TokenBucket::new(RetryBudget::new().capacity(15)));
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.attempts(), 4, "15 tokens pay for three retries at 5");
    assert!(err.is_budget_exhausted());
    let last = err.history().last().unwrap();
    assert_eq!(last.retry_delay, None);
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
                RetryBudget::new().capacity(5).success_deposit(5),
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
async fn timeouts_cost_more_than_errors() {
    let h = Harness::with([Step::Hang, Step::Hang, Step::Ok], |mut t| {
        t.timeout = Some(ms(100));
        t.budget = Some(TokenBucket::new(RetryBudget::new().capacity(15)));
        t
    });
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(
        err.attempts(),
        2,
        "one timeout retry (10) paid, the second refused"
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
        t.policy = t.policy.max_elapsed(Duration::MAX);
        t.timeout = Some(Duration::MAX);
        t
    });
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.seen().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_retry_cancelled_in_its_backoff_is_refunded() {
    let h = Harness::with([waiting(30), Step::Ok], |mut t| {
        t.budget = Some(TokenBucket::new(RetryBudget::new().capacity(20)));
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
    let in_use = Step::Fail(ErrorKind::Http {
        status: 409,
        code: Some("IDEMPOTENCY_KEY_IN_USE".into()),
        message: String::new(),
    });
    let h = Harness::with([in_use, Step::Ok], |mut t| {
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
