//! An Apache Kafka cluster under test, as `scripts/kafka start` describes it in its JSON line (`DIR/cluster.json`):
//! its nodes' processes, for the faults the embedded broker can only imitate (a node killed, frozen, the active
//! controller killed, every node at once). The cluster is not the harness's child: its pids come from `DIR/pids`
//! (kept current by `restart-node`), and a node is started again through the script named by `control`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

pub struct Cluster {
    pub bootstrap_servers: String,
    dir: PathBuf,
    /// `scripts/kafka`: `restart-node` and `quorum-leader`.
    control: PathBuf,
    pub node_ids: Vec<i32>,
}

impl Cluster {
    /// Reads the JSON line `scripts/kafka start` printed (it also writes it to `DIR/cluster.json`).
    pub fn from_file(path: &Path) -> anyhow::Result<Cluster> {
        let text = std::fs::read_to_string(path).with_context(|| format!("--kafka-cluster: reading {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(text.trim())
            .with_context(|| format!("--kafka-cluster: {} is not the JSON line of scripts/kafka start", path.display()))?;
        let field = |k: &str| v[k].as_str().with_context(|| format!("--kafka-cluster: {} has no string `{k}`", path.display()));
        let node_ids: Vec<i32> = v["nodes"]
            .as_array()
            .with_context(|| format!("--kafka-cluster: {} has no `nodes`", path.display()))?
            .iter()
            .filter_map(|n| n["id"].as_i64().and_then(|id| i32::try_from(id).ok()))
            .collect();
        anyhow::ensure!(!node_ids.is_empty(), "--kafka-cluster: {} lists no node", path.display());
        Ok(Cluster {
            bootstrap_servers: field("bootstrap_servers")?.to_owned(),
            dir: PathBuf::from(field("dir")?),
            control: PathBuf::from(field("control")?),
            node_ids,
        })
    }

    /// The node's current pid (line `id` of `DIR/pids`).
    fn pid(&self, id: i32) -> anyhow::Result<libc::pid_t> {
        let pids = std::fs::read_to_string(self.dir.join("pids")).with_context(|| format!("reading {}/pids", self.dir.display()))?;
        let line = usize::try_from(id).ok().and_then(|i| i.checked_sub(1)).and_then(|i| pids.lines().nth(i));
        let pid = line.with_context(|| format!("node {id} has no line in {}/pids", self.dir.display()))?.trim();
        let pid: libc::pid_t = pid.parse().with_context(|| format!("node {id}'s pid {pid:?}"))?;
        // kill(2) reads 0 and negative pids as process groups, 1 is init: never a node.
        anyhow::ensure!(pid > 1, "node {id}'s pid {pid} in {}/pids is not a process of its own", self.dir.display());
        Ok(pid)
    }

    fn signal(&self, id: i32, sig: libc::c_int) -> anyhow::Result<()> {
        let pid = self.pid(id)?;
        // SAFETY: kill(2) with a pid read from the cluster's own pid file.
        let rc = unsafe { libc::kill(pid, sig) };
        anyhow::ensure!(rc == 0, "kill({pid}, {sig}) of node {id}: {}", std::io::Error::last_os_error());
        Ok(())
    }

    /// SIGKILL, then wait until the process is gone (it is not our child: poll `kill(pid, 0)`).
    pub async fn kill9(&self, id: i32) -> anyhow::Result<()> {
        let pid = self.pid(id)?;
        self.signal(id, libc::SIGKILL)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: signal 0 only checks that the pid exists.
        while unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid) {
            anyhow::ensure!(Instant::now() < deadline, "node {id} (pid {pid}) still runs 10 s after SIGKILL");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    pub fn freeze(&self, id: i32) -> anyhow::Result<()> {
        self.signal(id, libc::SIGSTOP)
    }

    pub fn thaw(&self, id: i32) -> anyhow::Result<()> {
        self.signal(id, libc::SIGCONT)
    }

    /// Starts a killed node again, with its data, ports and identity; returns once it logged that it started.
    pub async fn restart(&self, id: i32) -> anyhow::Result<()> {
        let dir = self.dir.display().to_string();
        self.run_control(&["restart-node", "--dir", &dir, "--node", &id.to_string()]).await.map(drop)
    }

    /// The node id of the active KRaft controller (the quorum's leader).
    pub async fn active_controller(&self) -> anyhow::Result<i32> {
        let out = self.run_control(&["quorum-leader", "--dir", &self.dir.display().to_string()]).await?;
        out.trim().parse().with_context(|| format!("{} quorum-leader printed {out:?}", self.control.display()))
    }

    /// The node leading the most partitions of `topic` (the busiest, as every partition carries the same flow).
    pub async fn busiest_leader(&self, settings: &hookline_kafka::KafkaSettings, topic: &str) -> anyhow::Result<i32> {
        let admin = hookline_kafka::client::admin(settings, "hookline-soak-faults")?;
        let md = tokio::task::block_in_place(|| admin.inner().fetch_metadata(Some(topic), Duration::from_secs(10)))
            .with_context(|| format!("the metadata of {topic}"))?;
        let mut led = std::collections::BTreeMap::<i32, usize>::new();
        for p in md.topics().iter().flat_map(|t| t.partitions()) {
            if p.leader() >= 0 {
                *led.entry(p.leader()).or_default() += 1;
            }
        }
        let busiest = led.into_iter().max_by_key(|(id, n)| (*n, -*id)).map(|(id, _)| id);
        busiest.with_context(|| format!("no partition of {topic} has a leader"))
    }

    /// Runs `control` (scripts/kafka) with `args` off the runtime's workers; its stdout, or an error with its stderr.
    async fn run_control(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::new(&self.control);
        cmd.args(args);
        let out = tokio::task::spawn_blocking(move || cmd.output()).await?;
        let out = out.with_context(|| format!("running {}", self.control.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "{} {}: {}",
            self.control.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Whether `pid` is a zombie (killed, not yet reaped by its parent, the script's shell): gone for our purpose.
fn is_zombie(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
