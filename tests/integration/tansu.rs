//! Pipeline tests against tansu (0.6.0), a Kafka-compatible broker run as a separate process: real long-poll
//! fetches, topics made through the admin API's CreateTopics, group coordination that is not librdkafka's own —
//! paths the embedded mock broker cannot exercise. `scripts/install-tansu` installs the binary (scripts/test runs
//! it); `HOOKLINE_TANSU` names another one.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pipeline;
use crate::support::Pipeline;

/// A tansu broker on a free loopback port with in-memory storage; killed on drop.
pub struct Tansu {
    child: Child,
    pub bootstrap: String,
}

fn binary() -> PathBuf {
    let path = std::env::var_os("HOOKLINE_TANSU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tools/tansu"));
    assert!(path.is_file(), "no tansu binary at {}: run scripts/install-tansu (or set HOOKLINE_TANSU)", path.display());
    path
}

impl Tansu {
    /// Starts the broker and creates every hookline topic through CreateTopics.
    pub async fn start(partitions: i32) -> Tansu {
        // tansu takes a port, not a listener: ask the kernel for a free one. Another process taking it in between
        // makes the broker exit, which the wait below reports.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(binary())
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url, "--storage-engine", "memory://tansu/"])
            .args(["--cluster-id", "hookline-test"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu starts");
        let mut t = Tansu { child, bootstrap: format!("127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t.child.try_wait().unwrap().is_none(), "tansu exited at start");
            assert!(Instant::now() < deadline, "tansu did not listen on {port} within 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t.create_topics(partitions).await;
        t
    }

    async fn create_topics(&self, partitions: i32) {
        let settings = hookline_kafka::KafkaSettings { bootstrap_servers: self.bootstrap.clone(), ..Default::default() };
        crate::support::create_topics(&settings, "hookline.", partitions, 1, &[]).await;
    }

    /// The pipeline (ingest, one dispatcher, retry-scheduler) against this broker.
    pub async fn pipeline(&self, partitions: i32) -> Pipeline {
        Pipeline::start_at(
            None,
            &self.bootstrap,
            partitions,
            |c| {
                // A real broker holds an empty fetch up to this long and answers as soon as records arrive.
                c.kafka.fetch_wait_max_ms = 100;
            },
            true,
        )
        .await
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_fans_out_by_filter_and_signs_every_request() {
    let t = Tansu::start(2).await;
    let p = t.pipeline(2).await;
    pipeline::fans_out_by_filter_and_signs_every_request_on(&p).await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_retries_follow_the_schedule_and_are_never_early() {
    let t = Tansu::start(2).await;
    pipeline::retries_follow_the_schedule_and_are_never_early_on(t.pipeline(2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_terminal_and_exhausted_deliveries_reach_the_dead_letter_topic() {
    let t = Tansu::start(2).await;
    pipeline::terminal_and_exhausted_deliveries_reach_the_dead_letter_topic_on(t.pipeline(2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_malformed_events_are_dead_lettered_without_stalling_the_partition() {
    let t = Tansu::start(1).await;
    pipeline::malformed_events_are_dead_lettered_without_stalling_the_partition_on(t.pipeline(1).await).await;
}
