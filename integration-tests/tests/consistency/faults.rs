//! The fault scheduler: one fault at a time, drawn from a seeded plan, made with the `docker`
//! command on the run's containers, held for a bounded time, healed, and logged with
//! timestamps into the [history](crate::history). Faults: a replica cut from the primary (its
//! container disconnected from the replication network, still reachable by sqlhttpd), a replica
//! paused, one sqlhttpd killed (SIGKILL) or stopped (SIGTERM) and started again. Nothing is
//! left broken: every fault is healed before the next starts, and none starts unless it can be
//! healed before the deadline.
//!
//! [`plan`] is pure (the tests draw from it with an injected RNG); [`run`] executes it. This
//! module knows the containers and docker; it must not know the workload or the checker.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::history::{Clock, FaultKind, FaultRecord, History};
use crate::rng::Rng;

/// The containers faults are made on.
#[derive(Debug, Clone, Default)]
pub(crate) struct Topology {
    /// The replicas' container names.
    pub(crate) replicas: Vec<String>,
    /// The network replication runs on (a replica disconnected from it is partitioned).
    pub(crate) replication_network: Option<String>,
    /// The sqlhttpd containers, by the index the history gives their servers, with their URLs.
    pub(crate) servers: Vec<(String, String)>,
    /// How long a fault on a replica is held, in milliseconds (`None`: 1-6 s). Longer than the
    /// client's read timeout, it asks whether a read a frozen replica holds still gets answered.
    pub(crate) replica_hold_ms: Option<(u64, u64)>,
}

impl Topology {
    /// The kinds of faults this topology can take, among `wanted`.
    pub(crate) fn kinds(&self, wanted: &[FaultKind]) -> Vec<FaultKind> {
        wanted
            .iter()
            .copied()
            .filter(|kind| match kind {
                FaultKind::Partition => {
                    !self.replicas.is_empty() && self.replication_network.is_some()
                }
                FaultKind::Pause => !self.replicas.is_empty(),
                FaultKind::Kill | FaultKind::Stop => !self.servers.is_empty(),
            })
            .collect()
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    pub(crate) kind: FaultKind,
    /// Index into the topology's replicas or servers.
    pub(crate) target: usize,
    /// The quiet time before it.
    pub(crate) gap: Duration,
    /// How long it is held before healing (for an sqlhttpd: how long it stays down).
    pub(crate) hold: Duration,
}

/// The longest any fault is held, unless the topology says otherwise for replicas.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(6);
/// The longest a restarted sqlhttpd may take to answer `/readyz` before the fault is logged as
/// failed.
pub(crate) const RESTART_ALLOWANCE: Duration = Duration::from_secs(30);
/// What the plan counts for a restart (the container starting, `/readyz`: about a second).
pub(crate) const RESTART_BUDGET: Duration = Duration::from_secs(5);

/// The next fault: a kind among `kinds` (each about equally likely), a target, a gap of 0.5-3 s
/// before it and a hold of 1-6 s (replicas; or the topology's `replica_hold_ms`) or 0.5-3 s
/// (sqlhttpd down). `None` without kinds.
pub(crate) fn plan(rng: &mut Rng, kinds: &[FaultKind], topology: &Topology) -> Option<Planned> {
    if kinds.is_empty() {
        return None;
    }
    let kind = kinds[usize::try_from(rng.below(kinds.len() as u64)).ok()?];
    let targets = if kind.downs_a_server() {
        topology.servers.len()
    } else {
        topology.replicas.len()
    };
    let target = usize::try_from(rng.below(targets as u64)).ok()?;
    let gap = Duration::from_millis(rng.between(500, 3_000));
    let hold = if kind.downs_a_server() {
        Duration::from_millis(rng.between(500, 3_000))
    } else {
        let (low, high) = topology.replica_hold_ms.unwrap_or((1_000, 6_000));
        Duration::from_millis(rng.between(low, high))
    };
    Some(Planned {
        kind,
        target,
        gap,
        hold,
    })
}

/// Whether a planned fault, started at `now_us`, is healed by `stop_us` at the latest.
pub(crate) fn fits(planned: &Planned, now_us: u64, stop_us: u64) -> bool {
    let mut needed = planned.gap + planned.hold;
    if planned.kind.downs_a_server() {
        needed += RESTART_BUDGET;
    }
    now_us.saturating_add(u64::try_from(needed.as_micros()).unwrap_or(u64::MAX)) <= stop_us
}

/// Writes one timestamped line of the fault log to stderr (past the test harness's capture).
fn log(clock: &Clock, line: &str) {
    let at = clock.now_us();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let _ = writeln!(
        std::io::stderr(),
        "fault +{:>7.3}s (unix {}.{:03}): {line}",
        at as f64 / 1e6,
        wall / 1000,
        wall % 1000
    );
}

async fn docker(args: &[&str]) -> Result<(), String> {
    let output = tokio::process::Command::new("docker")
        .args(args)
        .output()
        .await
        .map_err(|err| format!("docker {}: {err}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Waits until `url`'s `/readyz` answers 200, at most [`RESTART_ALLOWANCE`].
async fn wait_ready(url: &str) -> Result<(), String> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .retry(reqwest::retry::never())
        .timeout(Duration::from_secs(1))
        .build()
        .map_err(|err| err.to_string())?;
    let deadline = tokio::time::Instant::now() + RESTART_ALLOWANCE;
    while tokio::time::Instant::now() < deadline {
        if let Ok(response) = http.get(format!("{url}/readyz")).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "{url} was not ready {RESTART_ALLOWANCE:?} after its restart"
    ))
}

/// Makes one fault, holds it, heals it.
async fn inject(planned: Planned, topology: &Topology, clock: &Clock) -> FaultRecord {
    let (target, server) = if planned.kind.downs_a_server() {
        (
            topology.servers[planned.target].0.clone(),
            Some(planned.target),
        )
    } else {
        (topology.replicas[planned.target].clone(), None)
    };
    let start_us = clock.now_us();
    log(
        clock,
        &format!("{} on {target} for {:?}", planned.kind.name(), planned.hold),
    );
    let network = topology.replication_network.clone().unwrap_or_default();
    let made = match planned.kind {
        FaultKind::Partition => {
            docker(&["network", "disconnect", "--force", &network, &target]).await
        }
        FaultKind::Pause => docker(&["pause", &target]).await,
        FaultKind::Kill => docker(&["kill", "--signal", "KILL", &target]).await,
        FaultKind::Stop => match docker(&["kill", "--signal", "TERM", &target]).await {
            // The graceful stop ends when the container has.
            Ok(()) => tokio::time::timeout(RESTART_ALLOWANCE, docker(&["wait", &target]))
                .await
                .unwrap_or_else(|_| Err(format!("{target} did not stop after SIGTERM"))),
            err => err,
        },
    };
    tokio::time::sleep(planned.hold).await;
    let healed = match planned.kind {
        FaultKind::Partition => docker(&["network", "connect", &network, &target]).await,
        FaultKind::Pause => docker(&["unpause", &target]).await,
        FaultKind::Kill | FaultKind::Stop => match docker(&["start", &target]).await {
            Ok(()) => wait_ready(&topology.servers[planned.target].1).await,
            err => err,
        },
    };
    let error = match (made, healed) {
        (Ok(()), Ok(())) => None,
        (Err(err), _) | (_, Err(err)) => Some(err),
    };
    let healed_us = clock.now_us();
    log(
        clock,
        &format!(
            "healed {target} after {:.3}s{}",
            (healed_us - start_us) as f64 / 1e6,
            error
                .as_ref()
                .map_or_else(String::new, |err| format!(" (error: {err})"))
        ),
    );
    FaultRecord {
        kind: planned.kind,
        target,
        server,
        start_us,
        healed_us,
        error,
    }
}

/// Injects faults of `kinds` on `topology` from now until `stop_us` of `clock`, one at a time,
/// each recorded in `history`. Returns how many it injected.
pub(crate) async fn run(
    topology: Topology,
    kinds: Vec<FaultKind>,
    mut rng: Rng,
    clock: Clock,
    stop_us: u64,
    history: Arc<History>,
) -> usize {
    let mut injected = 0;
    while let Some(planned) = plan(&mut rng, &kinds, &topology) {
        if !fits(&planned, clock.now_us(), stop_us) {
            break;
        }
        tokio::time::sleep(planned.gap).await;
        history.push_fault(inject(planned, &topology, &clock).await);
        injected += 1;
    }
    injected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology() -> Topology {
        Topology {
            replicas: vec!["replica-1".to_owned(), "replica-2".to_owned()],
            replication_network: Some("replication".to_owned()),
            servers: vec![
                ("sqlhttpd-a".to_owned(), "http://127.0.0.1:1".to_owned()),
                ("sqlhttpd-b".to_owned(), "http://127.0.0.1:2".to_owned()),
            ],
            replica_hold_ms: None,
        }
    }

    #[test]
    fn the_plan_draws_every_kind_and_target_within_its_bounds() {
        let topology = topology();
        let kinds = topology.kinds(&FaultKind::ALL);
        let mut rng = Rng::seeded(42);
        let draws: Vec<Planned> = (0..400)
            .map(|_| plan(&mut rng, &kinds, &topology).unwrap())
            .collect();
        for kind in FaultKind::ALL {
            for target in 0..2 {
                assert!(
                    draws.iter().any(|p| p.kind == kind && p.target == target),
                    "{kind:?} on {target} never drawn"
                );
            }
        }
        assert!(
            draws
                .iter()
                .all(|p| p.hold <= MAX_HOLD && p.gap <= Duration::from_secs(3))
        );
        assert!(
            draws
                .iter()
                .filter(|p| p.kind.downs_a_server())
                .all(|p| p.hold <= Duration::from_secs(3))
        );
    }

    #[test]
    fn replica_faults_can_be_held_longer_than_a_read_may_take() {
        let topology = Topology {
            replica_hold_ms: Some((12_000, 15_000)),
            ..topology()
        };
        let mut rng = Rng::seeded(3);
        let kinds = [FaultKind::Pause];
        for _ in 0..50 {
            let planned = plan(&mut rng, &kinds, &topology).unwrap();
            assert!((12_000..=15_000).contains(&(planned.hold.as_millis() as u64)));
        }
    }

    #[test]
    fn the_same_seed_plans_the_same_faults() {
        let topology = topology();
        let kinds = topology.kinds(&FaultKind::ALL);
        let (mut a, mut b) = (Rng::seeded(9), Rng::seeded(9));
        for _ in 0..20 {
            assert_eq!(
                plan(&mut a, &kinds, &topology),
                plan(&mut b, &kinds, &topology)
            );
        }
    }

    #[test]
    fn a_topology_offers_only_the_faults_it_can_take() {
        let mut topology = topology();
        topology.replication_network = None;
        assert_eq!(
            topology.kinds(&FaultKind::ALL),
            vec![FaultKind::Pause, FaultKind::Kill, FaultKind::Stop]
        );
        assert!(Topology::default().kinds(&FaultKind::ALL).is_empty());
        assert_eq!(plan(&mut Rng::seeded(1), &[], &Topology::default()), None);
    }

    #[test]
    fn no_fault_starts_unless_it_is_healed_before_the_stop() {
        let replica = Planned {
            kind: FaultKind::Pause,
            target: 0,
            gap: Duration::from_secs(1),
            hold: Duration::from_secs(2),
        };
        assert!(fits(&replica, 0, 3_000_000));
        assert!(!fits(&replica, 1, 3_000_000));
        let server = Planned {
            kind: FaultKind::Kill,
            ..replica
        };
        assert!(!fits(&server, 0, 3_000_000));
        assert!(fits(&server, 0, 8_000_000));
    }
}
