//! The loop's load controls on the paused clock: what a retry costs the budget and how long it
//! waits by its cause (throttle, failure, timeout), the retry state a caller reads, and the adaptive
//! send rate that may delay a first attempt.

use super::*;
use crate::retry::rate::AdaptiveRate;

fn tokens(h: &Harness) -> u32 {
    h.transport.retry_state().tokens().unwrap()
}

fn budget_of(capacity: u32) -> impl FnOnce(Transport) -> Transport {
    move |mut t| {
        t.budget = Some(TokenBucket::new(RetryBudget::new().with_capacity(capacity)));
        t.retry_writes = true;
        t.timeout = Some(ms(100));
        t
    }
}

/// Each cause the issue names, one retry each, then a success (which deposits 1).
#[tokio::test(start_paused = true)]
async fn each_cause_pays_its_own_price() {
    let busy_with_wait = Step::Fail(ErrorKind::Unavailable {
        retry_after: Some(Duration::ZERO),
        message: String::new(),
    });
    let reset = Step::Fail(ErrorKind::Connection {
        message: "reset".into(),
    });
    let rows: [(Step, OpClass, u32, &str); 7] = [
        (waiting(0), OpClass::Read, 5, "429"),
        (busy_with_wait, OpClass::Read, 5, "503 with Retry-After"),
        (key_in_use(Some(0)), OpClass::Write, 5, "409 key in use"),
        (unavailable(), OpClass::Read, 14, "503 without Retry-After"),
        (status(500), OpClass::Read, 14, "500"),
        (reset, OpClass::Read, 14, "a lost connection"),
        (Step::Hang, OpClass::Read, 14, "a timeout"),
    ];
    for (step, class, cost, cause) in rows {
        let h = Harness::with([step, Step::Ok], budget_of(100));
        h.send(class).await.unwrap();
        assert_eq!(tokens(&h), 100 - cost + 1, "{cause}");
        assert_eq!(h.seen().len(), 2, "{cause}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_drained_budget_still_pays_for_throttles_it_refuses_failures() {
    // 10 tokens: a failure's retry (14) is refused, a throttle's (5) is paid twice.
    let h = Harness::with(
        [unavailable(), waiting(0), waiting(0), waiting(0), Step::Ok],
        |mut t| {
            t.budget = Some(TokenBucket::new(RetryBudget::new().with_capacity(10)));
            t.policy = t.policy.with_max_attempts(10);
            t
        },
    );
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(
        err.is_budget_exhausted() && err.status() == Some(503),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 1);
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(
        err.is_budget_exhausted() && err.status() == Some(429),
        "{err:?}"
    );
    assert_eq!(err.attempts(), 3, "two throttle retries at 5");
    assert_eq!(err.retry_state().unwrap().tokens(), Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_throttle_backs_off_from_a_second_a_failure_from_100_ms() {
    let limited = || {
        Step::Fail(ErrorKind::RateLimited {
            retry_after: None,
            message: String::new(),
        })
    };
    let h = Harness::new([limited(), limited(), Step::Ok]);
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(1_000), ms(3_000)]);
    let h = Harness::new([unavailable(), unavailable(), Step::Ok]);
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(100), ms(300)]);
    // The bases are the policy's.
    let h = Harness::with([limited(), Step::Ok], |mut t| {
        t.policy = t.policy.with_throttle_initial_backoff(ms(250));
        t
    });
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(250)]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_computed_delay_plus_the_extra_is_cut_to_it() {
    let h = Harness::with([waiting(60), Step::Ok], |mut t| {
        t.policy = t.policy.with_retry_after_max_extra(ms(500));
        t
    });
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(1_500)], "1 s computed + 0.5 s");
}

fn adaptive(mut t: Transport) -> Transport {
    t.rate = Some(AdaptiveRate::new());
    t.policy = RetryPolicy::never();
    t
}

/// The wait for one turn at `rate` attempts a second.
fn turn(rate: f64) -> Duration {
    Duration::from_secs_f64(1.0 / rate)
}

/// Equal within the paused clock's millisecond.
fn assert_near(got: Duration, want: Duration) {
    let gap = got.abs_diff(want);
    assert!(gap <= ms(1), "{got:?} is not {want:?}");
}

/// A throttle at the very start: one answer in the first half second measured as 2 a second,
/// the rate cut to 0.7 of it. The next call's first attempt waits its turn.
#[tokio::test(start_paused = true)]
async fn after_a_throttle_even_a_first_attempt_waits_its_turn() {
    let h = Harness::with([waiting(0), Step::Ok, Step::Ok], adaptive);
    assert_eq!(
        h.transport.retry_state().send_rate(),
        None,
        "off until throttled"
    );
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert_eq!(err.status(), Some(429));
    let rate = h.transport.retry_state().send_rate().unwrap();
    assert!((rate - 1.4).abs() < 1e-9, "{rate}");
    h.send(OpClass::Read).await.unwrap();
    let times = h.times();
    assert_eq!(times[0], ms(0));
    assert_near(times[1], turn(rate));
    // Answers without throttles raise it again.
    let risen = h.transport.retry_state().send_rate().unwrap();
    assert!(risen > rate, "{risen}");
}

#[tokio::test(start_paused = true)]
async fn cancellation_ends_the_wait_for_a_turn_at_once_and_sends_nothing() {
    let h = Harness::with([waiting(0), Step::Ok], adaptive);
    h.send(OpClass::Read).await.unwrap_err();
    let rate = h.transport.retry_state().send_rate().unwrap();
    let token = CancellationToken::new();
    let started = Instant::now();
    let (outcome, ()) = tokio::join!(h.send_with(OpClass::Read, Some(&token)), async {
        tokio::time::sleep(ms(300)).await;
        token.cancel();
    });
    assert_eq!(outcome.unwrap_err().kind(), &ErrorKind::Cancelled);
    assert_eq!(started.elapsed(), ms(300));
    assert_eq!(h.seen().len(), 1, "nothing sent");
    // The turn was given back: the next call goes when the cancelled one would have, not later.
    h.send(OpClass::Read).await.unwrap();
    assert_near(h.times()[1], turn(rate));
}

#[tokio::test(start_paused = true)]
async fn a_turn_past_max_elapsed_fails_at_once_without_sending() {
    let h = Harness::with([waiting(0), Step::Ok], adaptive);
    h.send(OpClass::Read).await.unwrap_err();
    let rate = h.transport.retry_state().send_rate().unwrap();
    let options = CallOptions {
        retry: Some(RetryPolicy::never().with_max_elapsed(ms(500))),
        ..CallOptions::default()
    };
    let started = Instant::now();
    let err = h.send_options(OpClass::Read, options).await.unwrap_err();
    let ErrorKind::ClientRateLimited { wait } = *err.kind() else {
        panic!("{err:?}");
    };
    assert_near(wait, turn(rate));
    assert_eq!((err.attempts(), err.is_sent()), (0, false));
    assert_eq!(err.retry_state().unwrap().send_rate(), Some(rate));
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(h.seen().len(), 1);
}

/// A retry after a throttle waits for the later of its backoff and its turn.
#[tokio::test(start_paused = true)]
async fn a_retry_waits_for_its_turn_too() {
    let h = Harness::with([waiting(0), Step::Ok], |t| {
        let mut t = adaptive(t);
        t.policy = RetryPolicy::new().with_jitter(Jitter::None);
        t
    });
    h.send(OpClass::Read).await.unwrap();
    let rate = 1.4;
    assert_near(h.times()[1], turn(rate));
    assert!(
        h.times()[1] > ms(0),
        "Retry-After 0, but the turn comes later"
    );
}

/// A keyed write whose answer was lost, then refused before the server read it (the token was
/// revoked, the body is now too large for a changed limit): the refusal says nothing of the first
/// attempt, whose outcome stays unknown; an answer that ran the statement settles it.
#[tokio::test(start_paused = true)]
async fn a_refusal_before_the_key_is_read_leaves_a_lost_answer_unknown() {
    let refusals = [
        ErrorKind::Unauthorized {
            message: String::new(),
        },
        ErrorKind::ReadOnly {
            message: String::new(),
        },
        ErrorKind::PayloadTooLarge {
            message: String::new(),
        },
        ErrorKind::Http {
            status: 403,
            code: Some("ORIGIN_NOT_ALLOWED".into()),
            message: String::new(),
        },
    ];
    for refusal in refusals {
        let h = Harness::with([Step::Hang, Step::Fail(refusal.clone())], |mut t| {
            t.retry_writes = true;
            t.timeout = Some(ms(200));
            t
        });
        let err = h
            .deliver_with(OpClass::Write, &CallOptions::default(), Some("order-9"))
            .await
            .unwrap_err();
        assert_eq!((err.kind(), err.attempts()), (&refusal, 2));
        assert!(err.is_outcome_unknown(), "{refusal:?}: {err:?}");
        assert_eq!(err.idempotency_key(), Some("order-9"));
    }
    // Refused before anything was unanswered: nothing is unknown.
    let h = Harness::with(
        [Step::Fail(ErrorKind::Unauthorized {
            message: String::new(),
        })],
        |mut t| {
            t.retry_writes = true;
            t
        },
    );
    let err = h.send(OpClass::Write).await.unwrap_err();
    assert!(!err.is_outcome_unknown(), "{err:?}");
}

/// A call dropped while it waits for its turn (`tokio::time::timeout` here) gives the turn back:
/// the next call goes when the dropped one would have, not a turn later.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_it_waits_gives_its_turn_back() {
    let h = Harness::with([waiting(0), Step::Ok], adaptive);
    h.send(OpClass::Read).await.unwrap_err();
    let rate = h.transport.retry_state().send_rate().unwrap();
    let dropped = tokio::time::timeout(ms(300), h.send(OpClass::Read)).await;
    assert!(dropped.is_err(), "still waiting when dropped");
    assert_eq!(h.seen().len(), 1, "nothing sent");
    h.send(OpClass::Read).await.unwrap();
    assert_near(h.times()[1], turn(rate));
}

/// A turn further away than `max_backoff` is not queued for: the call fails at once.
#[tokio::test(start_paused = true)]
async fn a_turn_further_than_max_backoff_fails_at_once() {
    let h = Harness::with([waiting(0), Step::Ok], |t| {
        let mut t = adaptive(t);
        t.policy = RetryPolicy::never().with_max_backoff(ms(500));
        t
    });
    h.send(OpClass::Read).await.unwrap_err();
    let err = h.send(OpClass::Read).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::ClientRateLimited { wait } if *wait > ms(500)),
        "{err:?}"
    );
    assert!(err.retry_state().is_some());
    assert_eq!(h.seen().len(), 1);
    // The refused turn was given back: a patient call goes on the first one, 1/1.4 s in.
    let patient = CallOptions {
        retry: Some(RetryPolicy::never()),
        ..CallOptions::default()
    };
    h.send_options(OpClass::Read, patient).await.unwrap();
    assert_near(h.times()[1], turn(1.4));
}

/// A transaction's steps are never paced: the server holds its locks and idle timeout meanwhile.
#[tokio::test(start_paused = true)]
async fn transaction_steps_are_not_paced() {
    let h = Harness::with([waiting(0), Step::Ok, Step::Ok], adaptive);
    h.send(OpClass::Read).await.unwrap_err();
    assert!(h.transport.retry_state().send_rate().is_some());
    h.send(OpClass::Step).await.unwrap();
    h.send(OpClass::Step).await.unwrap();
    assert_eq!(h.times(), vec![ms(0), ms(0), ms(0)]);
}
