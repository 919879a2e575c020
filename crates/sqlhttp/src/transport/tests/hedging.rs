//! Hedged reads through the attempt loop on the paused clock: a slow read is sent a second time,
//! the first answer wins and the other exchange is dropped; writes, executes and transaction steps
//! never are; the hedge budget stops hedging when every read is slow.

use std::collections::VecDeque;

use super::*;
use crate::transport::hedge::{HedgeDelay, HedgePolicy, Hedging};

/// What the exchanges saw: when each copy left, how many answered, how many were dropped unanswered.
#[derive(Debug, Default)]
struct Log {
    sent: Vec<Duration>,
    answered: usize,
    dropped: usize,
}

/// An exchange whose copies answer (or fail) after scripted delays, counting the ones dropped.
struct Copies {
    script: Mutex<VecDeque<(Duration, bool)>>,
    log: Arc<Mutex<Log>>,
    epoch: Instant,
}

/// Counts its exchange as dropped unless it answered.
struct Watch {
    log: Arc<Mutex<Log>>,
    answered: bool,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.answered {
            self.log.lock().unwrap().dropped += 1;
        }
    }
}

impl Exchange for Copies {
    fn send<'a>(&'a self, _request: AttemptRequest<'a>) -> ExchangeFuture<'a> {
        let (after, ok) = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((Duration::ZERO, true));
        self.log.lock().unwrap().sent.push(self.epoch.elapsed());
        let mut watch = Watch {
            log: self.log.clone(),
            answered: false,
        };
        Box::pin(async move {
            tokio::time::sleep(after).await;
            watch.answered = true;
            watch.log.lock().unwrap().answered += 1;
            if ok {
                Ok(Bytes::from_static(b"ok").into())
            } else {
                Err(ErrorKind::Connection {
                    message: "reset".into(),
                }
                .into())
            }
        })
    }
}

/// A harness whose exchange plays `script` (each copy's delay and whether it succeeds), hedging
/// under `policy`.
fn hedged(
    script: impl IntoIterator<Item = (Duration, bool)>,
    policy: Option<HedgePolicy>,
) -> (Harness, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let copies = Copies {
        script: Mutex::new(script.into_iter().collect()),
        log: log.clone(),
        epoch: Instant::now(),
    };
    let h = Harness::with([], move |mut t| {
        t.exchange = Box::new(copies);
        t.hedging = Hedging::new(policy);
        t.retry_writes = true;
        t
    });
    (h, log)
}

fn after_50_ms() -> Option<HedgePolicy> {
    Some(HedgePolicy::new().with_delay(HedgeDelay::Fixed(ms(50))))
}

/// Earns the budget a hedge: ten reads answered at once.
async fn earn_a_hedge(h: &Harness) {
    for _ in 0..10 {
        h.send(OpClass::Read).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_is_hedged_the_first_answer_wins_and_the_other_is_dropped() {
    let fast = std::iter::repeat_n((ms(0), true), 10);
    let (h, log) = hedged(
        fast.chain([(ms(10_000), true), (ms(5), true)]),
        after_50_ms(),
    );
    earn_a_hedge(&h).await;
    let started = Instant::now();
    assert_eq!(h.send(OpClass::Read).await.unwrap(), "ok");
    assert_eq!(
        started.elapsed(),
        ms(55),
        "the hedge's answer, not the first's"
    );
    let log = log.lock().unwrap();
    assert_eq!(&log.sent[10..], [ms(0), ms(50)]);
    assert_eq!(
        (log.answered, log.dropped),
        (11, 1),
        "the slow copy was dropped"
    );
    assert_eq!(h.transport.retry_state().hedges_sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_first_copy_wins_when_it_answers_first_and_the_hedge_is_dropped() {
    let fast = std::iter::repeat_n((ms(0), true), 10);
    let (h, log) = hedged(
        fast.chain([(ms(70), true), (ms(10_000), true)]),
        after_50_ms(),
    );
    earn_a_hedge(&h).await;
    let started = Instant::now();
    h.send(OpClass::Read).await.unwrap();
    assert_eq!(started.elapsed(), ms(70));
    let log = log.lock().unwrap();
    assert_eq!((log.sent.len(), log.dropped), (12, 1));
}

#[tokio::test(start_paused = true)]
async fn a_read_answered_within_the_delay_is_sent_once() {
    let (h, log) = hedged(std::iter::repeat_n((ms(40), true), 20), after_50_ms());
    for _ in 0..20 {
        h.send(OpClass::Read).await.unwrap();
    }
    assert_eq!(log.lock().unwrap().sent.len(), 20);
    assert_eq!(h.transport.retry_state().hedges_sent(), 0);
}

#[tokio::test(start_paused = true)]
async fn writes_executes_and_transaction_steps_are_never_hedged() {
    for class in [OpClass::Write, OpClass::Execute, OpClass::Step] {
        let (h, log) = hedged(std::iter::repeat_n((ms(500), true), 20), after_50_ms());
        let asked = CallOptions {
            hedge: Some(true),
            ..CallOptions::default()
        };
        for _ in 0..20 {
            h.deliver_bytes(class, &asked, None).await.unwrap();
        }
        let log = log.lock().unwrap();
        assert_eq!((log.sent.len(), log.dropped), (20, 0), "{class:?}");
        assert_eq!(h.transport.retry_state().hedges_sent(), 0, "{class:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_can_turn_hedging_on_or_off() {
    let slow = || std::iter::repeat_n((ms(500), true), 40);
    let (h, log) = hedged(slow(), after_50_ms());
    let off = CallOptions {
        hedge: Some(false),
        ..CallOptions::default()
    };
    for _ in 0..20 {
        h.send_options(OpClass::Read, off.clone()).await.unwrap();
    }
    assert_eq!(log.lock().unwrap().sent.len(), 20, "off for these calls");
    // A client without a policy, a call that asks: the default policy (percentile 95, which
    // waits for 20 timed reads).
    let (h, log) = hedged(slow().take(20).chain([(ms(2_000), true)]), None);
    let on = CallOptions {
        hedge: Some(true),
        ..CallOptions::default()
    };
    for _ in 0..20 {
        h.send_options(OpClass::Read, on.clone()).await.unwrap();
    }
    assert_eq!(
        log.lock().unwrap().sent.len(),
        20,
        "no percentile before 20 reads"
    );
    let started = Instant::now();
    h.send_options(OpClass::Read, on).await.unwrap();
    assert_eq!(
        log.lock().unwrap().sent.len(),
        22,
        "hedged at the 95th percentile"
    );
    assert_eq!(started.elapsed(), ms(500), "the hedge answered at once");
}

/// Every first copy is slow (a partial outage): hedging stops at a tenth of the reads.
#[tokio::test(start_paused = true)]
async fn the_hedge_budget_stops_hedging_when_every_read_is_slow() {
    let (h, log) = hedged(
        std::iter::repeat_n([(ms(1_000), true), (ms(1), true)], 200).flatten(),
        after_50_ms(),
    );
    for _ in 0..100 {
        h.send(OpClass::Read).await.unwrap();
    }
    let hedges = h.transport.retry_state().hedges_sent();
    assert_eq!(hedges, 10, "10% of 100 reads");
    assert_eq!(log.lock().unwrap().sent.len(), 110);
}

#[tokio::test(start_paused = true)]
async fn a_copy_that_fails_leaves_the_race_to_the_other() {
    let fast = std::iter::repeat_n((ms(0), true), 10);
    let (h, log) = hedged(
        fast.chain([(ms(100), false), (ms(200), true)]),
        after_50_ms(),
    );
    earn_a_hedge(&h).await;
    let started = Instant::now();
    let delivered = h
        .deliver_with(OpClass::Read, &CallOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(started.elapsed(), ms(250));
    assert_eq!(delivered.attempts, 1, "one attempt, hedged; not a retry");
    assert_eq!(log.lock().unwrap().sent.len(), 12);
}

#[tokio::test(start_paused = true)]
async fn when_both_copies_fail_the_attempt_fails_and_is_retried() {
    let fast = std::iter::repeat_n((ms(0), true), 10);
    let (h, log) = hedged(
        fast.chain([(ms(100), false), (ms(10), false), (ms(0), true)]),
        after_50_ms(),
    );
    earn_a_hedge(&h).await;
    let delivered = h
        .deliver_with(OpClass::Read, &CallOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(delivered.attempts, 2);
    assert_eq!(delivered.history[0].failure, "connection");
    assert_eq!(log.lock().unwrap().sent.len(), 13);
}
