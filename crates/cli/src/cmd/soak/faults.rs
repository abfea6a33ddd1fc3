//! The faults the harness injects, and the fleet of processes it injects them into. Each fault is applied and
//! lifted (or its victim restarted) before the next one starts, and leaves a line in the fault schedule.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::cluster::Cluster;
use super::ledger::Ledger;
use super::procs::{Broker, Role, Service};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultKind {
    /// SIGKILL a dispatcher mid-delivery, restart it at once (the dispatchers take turns).
    KillDispatcher,
    /// SIGKILL the retry-scheduler while it holds records, restart it.
    KillScheduler,
    /// SIGKILL ingest mid fan-out and mid-request, restart it.
    KillIngest,
    /// SIGSTOP a dispatcher past the session timeout (its partitions move while it holds work), then SIGCONT.
    StopDispatcher,
    /// SIGTERM a dispatcher: it must drain and exit 0; restart it.
    TermDispatcher,
    /// SIGTERM the retry-scheduler; restart it.
    TermScheduler,
    /// SIGTERM ingest; restart it.
    TermIngest,
    /// The broker unreachable for 3 s.
    BrokerDown,
    /// Every produce request fails (NOT_LEADER_FOR_PARTITION) for 2 s.
    ProduceErrors,
    /// Every fetch request fails (NOT_LEADER_FOR_PARTITION) for 2 s.
    FetchErrors,
    /// Every offset commit fails (NOT_COORDINATOR) for 2 s.
    CommitErrors,
    /// Every broker answer comes 500 ms late for 3 s.
    BrokerSlow,
    /// Every consumer-group request (JoinGroup, SyncGroup, Heartbeat) fails (NOT_COORDINATOR) for 2 s.
    GroupErrors,
    /// SIGKILL the Apache Kafka node leading the most `deliveries` partitions; start it again 5 s later
    /// (`--kafka-cluster`).
    KillBroker,
    /// SIGSTOP the node leading the most `deliveries` partitions past the controller's broker session timeout (9 s
    /// by default), then SIGCONT (`--kafka-cluster`).
    StopBroker,
    /// SIGKILL the active KRaft controller; start it again 5 s later (`--kafka-cluster`).
    KillController,
    /// SIGKILL every node at once; start them all again 5 s later (`--kafka-cluster`).
    RestartCluster,
}

/// What a fault acts on, so a run applies only the faults its broker can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// hookline's own processes: any broker.
    Services,
    /// The embedded broker's injected errors and delays (`hookline dev-broker --control`).
    EmbeddedBroker,
    /// The processes of an Apache Kafka cluster (`--kafka-cluster`).
    Cluster,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillDispatcher => "kill-dispatcher",
            FaultKind::KillScheduler => "kill-scheduler",
            FaultKind::KillIngest => "kill-ingest",
            FaultKind::StopDispatcher => "stop-dispatcher",
            FaultKind::TermDispatcher => "term-dispatcher",
            FaultKind::TermScheduler => "term-scheduler",
            FaultKind::TermIngest => "term-ingest",
            FaultKind::BrokerDown => "broker-down",
            FaultKind::ProduceErrors => "produce-errors",
            FaultKind::FetchErrors => "fetch-errors",
            FaultKind::CommitErrors => "commit-errors",
            FaultKind::BrokerSlow => "broker-slow",
            FaultKind::GroupErrors => "group-errors",
            FaultKind::KillBroker => "kill-broker",
            FaultKind::StopBroker => "stop-broker",
            FaultKind::KillController => "kill-controller",
            FaultKind::RestartCluster => "restart-cluster",
        }
    }

    pub fn target(self) -> Target {
        match self {
            FaultKind::KillDispatcher
            | FaultKind::KillScheduler
            | FaultKind::KillIngest
            | FaultKind::StopDispatcher
            | FaultKind::TermDispatcher
            | FaultKind::TermScheduler
            | FaultKind::TermIngest => Target::Services,
            FaultKind::BrokerDown
            | FaultKind::ProduceErrors
            | FaultKind::FetchErrors
            | FaultKind::CommitErrors
            | FaultKind::BrokerSlow
            | FaultKind::GroupErrors => Target::EmbeddedBroker,
            FaultKind::KillBroker | FaultKind::StopBroker | FaultKind::KillController | FaultKind::RestartCluster => Target::Cluster,
        }
    }

    /// Consumer-group rebalances the fault causes, each of which may redo a window of uncommitted work (at least
    /// once): the victim's expiry and its successor's join for a kill or a freeze; a broker outage can outlast the
    /// session timeout (librdkafka's reconnect backoff); a slow broker or failing group requests can cost a member
    /// its session. A SIGTERM drains and commits, and request errors move no partitions: those redo nothing. A
    /// node lost can take a group's coordinator with it (its members rejoin the next one); the whole cluster down
    /// can outlast every session.
    pub fn rebalances(self) -> u64 {
        match self {
            FaultKind::KillDispatcher | FaultKind::KillIngest | FaultKind::StopDispatcher | FaultKind::KillScheduler => 2,
            FaultKind::RestartCluster => 2,
            FaultKind::BrokerDown | FaultKind::BrokerSlow | FaultKind::GroupErrors => 1,
            FaultKind::KillBroker | FaultKind::StopBroker | FaultKind::KillController => 1,
            FaultKind::TermDispatcher
            | FaultKind::TermScheduler
            | FaultKind::TermIngest
            | FaultKind::ProduceErrors
            | FaultKind::FetchErrors
            | FaultKind::CommitErrors => 0,
        }
    }
}

const BROKER_DOWN_FOR: Duration = Duration::from_secs(3);
const BROKER_SLOW_FOR: Duration = Duration::from_secs(3);
const BROKER_SLOW_RTT_MS: u64 = 500;
const ERRORS_FOR: Duration = Duration::from_secs(2);
/// How long a killed Apache Kafka node stays down before it is started again.
const NODE_DOWN_FOR: Duration = Duration::from_secs(5);
/// A frozen node is held past the controller's `broker.session.timeout.ms` (9 s by default), so it is fenced.
const NODE_FROZEN_FOR: Duration = Duration::from_secs(12);
/// After a cluster fault: the receiver's requests that show deliveries flow again, and how long to wait for them.
const RESUMED_REQUESTS: u64 = 20;
const RESUME_LIMIT: Duration = Duration::from_secs(120);

/// The broker the services run on.
pub enum Brokers {
    /// `hookline dev-broker --control`, which takes the injected faults (`None` until it is started).
    Embedded(Option<Broker>),
    /// An Apache Kafka cluster from `scripts/kafka start` (`--kafka-cluster`): its nodes can be killed and frozen.
    Cluster(Cluster),
    /// Any other cluster (`--brokers`): only hookline's processes take faults.
    External,
}

impl Brokers {
    /// Whether faults on `target` can be applied to this broker.
    pub fn takes(&self, target: Target) -> bool {
        matches!(
            (target, self),
            (Target::Services, _) | (Target::EmbeddedBroker, Brokers::Embedded(_)) | (Target::Cluster, Brokers::Cluster(_))
        )
    }

    fn embedded(&mut self) -> anyhow::Result<&mut Broker> {
        match self {
            Brokers::Embedded(Some(b)) => Ok(b),
            _ => anyhow::bail!("this fault needs the embedded broker"),
        }
    }

    fn cluster(&self) -> anyhow::Result<&Cluster> {
        match self {
            Brokers::Cluster(c) => Ok(c),
            _ => anyhow::bail!("this fault needs --kafka-cluster"),
        }
    }
}

pub struct Fleet {
    pub broker: Brokers,
    /// The `deliveries` topic, whose busiest leader the node faults pick.
    pub deliveries_topic: String,
    pub kafka: hookline_kafka::KafkaSettings,
    pub ingest: Service,
    pub dispatchers: Vec<Service>,
    pub scheduler: Service,
    /// The services' group session timeout: a frozen dispatcher is held past it.
    pub session_timeout: Duration,
    /// How long a SIGTERMed service may take to exit.
    pub term_limit: Duration,
    /// Exits the harness did not cause: (service, status).
    pub unexpected_exits: Vec<(String, String)>,
}

impl Fleet {
    pub fn services(&mut self) -> impl Iterator<Item = &mut Service> {
        std::iter::once(&mut self.ingest).chain(self.dispatchers.iter_mut()).chain(std::iter::once(&mut self.scheduler))
    }

    /// Restarts any service that died on its own, and remembers that it did.
    pub fn revive(&mut self) -> anyhow::Result<()> {
        let mut died = Vec::new();
        for s in self.services() {
            if let Some(status) = s.exited() {
                died.push((s.name.clone(), status.to_string()));
                s.start()?;
            }
        }
        for (name, status) in &died {
            eprintln!("soak: {name} exited on its own ({status}); restarted");
        }
        self.unexpected_exits.extend(died);
        Ok(())
    }

    fn by_role(&mut self, role: Role, turn: usize) -> &mut Service {
        match role {
            Role::Ingest => &mut self.ingest,
            Role::RetryScheduler => &mut self.scheduler,
            Role::Dispatcher => {
                let n = self.dispatchers.len();
                &mut self.dispatchers[turn % n]
            }
        }
    }

    /// Applies one fault and lifts it; returns its line of the fault schedule. `turn` picks the dispatcher.
    pub async fn apply(&mut self, fault: FaultKind, turn: usize, t0: Instant, ledger: &Ledger) -> anyhow::Result<Value> {
        let at_s = t0.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut line = json!({"at_s": (at_s * 10.0).round() / 10.0, "fault": fault.name()});
        match fault {
            FaultKind::KillDispatcher | FaultKind::KillScheduler | FaultKind::KillIngest => {
                let role = match fault {
                    FaultKind::KillDispatcher => Role::Dispatcher,
                    FaultKind::KillScheduler => Role::RetryScheduler,
                    _ => Role::Ingest,
                };
                let s = self.by_role(role, turn);
                line["target"] = json!(s.name);
                s.kill9()?;
                s.start()?;
            }
            FaultKind::TermDispatcher | FaultKind::TermScheduler | FaultKind::TermIngest => {
                let role = match fault {
                    FaultKind::TermDispatcher => Role::Dispatcher,
                    FaultKind::TermScheduler => Role::RetryScheduler,
                    _ => Role::Ingest,
                };
                let limit = self.term_limit;
                let s = self.by_role(role, turn);
                line["target"] = json!(s.name);
                let status = s.terminate(limit).await?;
                line["exit_code"] = json!(status.code());
                line["drain_ms"] = json!(started.elapsed().as_millis() as u64);
                s.start()?;
            }
            FaultKind::StopDispatcher => {
                let hold = self.session_timeout + Duration::from_secs(2);
                let s = self.by_role(Role::Dispatcher, turn);
                line["target"] = json!(s.name);
                s.freeze()?;
                tokio::time::sleep(hold).await;
                s.thaw()?;
                line["held_ms"] = json!(hold.as_millis() as u64);
            }
            FaultKind::BrokerDown => {
                self.broker.embedded()?.command("down")?;
                tokio::time::sleep(BROKER_DOWN_FOR).await;
                self.broker.embedded()?.command("up")?;
                line["held_ms"] = json!(BROKER_DOWN_FOR.as_millis() as u64);
            }
            FaultKind::BrokerSlow => {
                self.broker.embedded()?.command(&format!("rtt {BROKER_SLOW_RTT_MS}"))?;
                tokio::time::sleep(BROKER_SLOW_FOR).await;
                self.broker.embedded()?.command("rtt 0")?;
                line["held_ms"] = json!(BROKER_SLOW_FOR.as_millis() as u64);
                line["rtt_ms"] = json!(BROKER_SLOW_RTT_MS);
            }
            FaultKind::ProduceErrors | FaultKind::FetchErrors | FaultKind::CommitErrors | FaultKind::GroupErrors => {
                let api = match fault {
                    FaultKind::ProduceErrors => "produce",
                    FaultKind::FetchErrors => "fetch",
                    FaultKind::GroupErrors => "group",
                    _ => "commit",
                };
                self.broker.embedded()?.command(&format!("errors {api}"))?;
                tokio::time::sleep(ERRORS_FOR).await;
                self.broker.embedded()?.command(&format!("clear {api}"))?;
                line["held_ms"] = json!(ERRORS_FOR.as_millis() as u64);
            }
            FaultKind::KillBroker | FaultKind::KillController | FaultKind::RestartCluster | FaultKind::StopBroker => {
                let cluster = self.broker.cluster()?;
                let nodes = match fault {
                    FaultKind::KillController => vec![cluster.active_controller().await?],
                    FaultKind::RestartCluster => cluster.node_ids.clone(),
                    _ => vec![cluster.busiest_leader(&self.kafka, &self.deliveries_topic).await?],
                };
                line["nodes"] = json!(nodes);
                if fault == FaultKind::StopBroker {
                    cluster.freeze(nodes[0])?;
                    tokio::time::sleep(NODE_FROZEN_FOR).await;
                    cluster.thaw(nodes[0])?;
                    line["held_ms"] = json!(NODE_FROZEN_FOR.as_millis() as u64);
                } else {
                    for id in &nodes {
                        cluster.kill9(*id).await?;
                    }
                    tokio::time::sleep(NODE_DOWN_FOR).await;
                    let restarting = Instant::now();
                    // Started side by side: a lone node of a quorum waits for the others.
                    futures::future::try_join_all(nodes.iter().map(|id| cluster.restart(*id))).await?;
                    line["held_ms"] = json!(NODE_DOWN_FOR.as_millis() as u64);
                    line["restart_ms"] = json!(restarting.elapsed().as_millis() as u64);
                }
                // How soon deliveries flow again once the node is back (only while there is work to deliver).
                let lifted = Instant::now();
                let resumed = ledger.wait_requests(ledger.requests().saturating_add(RESUMED_REQUESTS), RESUME_LIMIT).await;
                line["resumed_s"] = if resumed { json!((lifted.elapsed().as_secs_f64() * 10.0).round() / 10.0) } else { Value::Null };
            }
        }
        eprintln!("soak: fault {line}");
        Ok(line)
    }
}
