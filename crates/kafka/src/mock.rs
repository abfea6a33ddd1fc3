//! The embedded broker: librdkafka's mock cluster, speaking the Kafka protocol on 127.0.0.1 so separate
//! processes can use it. In-memory, no compaction, ~5 MiB per partition: for dev mode and tests only.

use std::ffi::CString;

use rdkafka::client::Client;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaType;

use crate::topics::Topics;

pub struct DevBroker {
    /// A client whose `test.mock.num.brokers` made librdkafka start the mock cluster; it owns the cluster (and
    /// destroys it when dropped). Created this way rather than with `MockCluster::new` so that the cluster's
    /// native handle is reachable: [`DevBroker::advertise`] needs it.
    client: Client<DefaultProducerContext>,
}

impl DevBroker {
    /// Starts a one-broker mock cluster and creates every hookline topic (the mock broker cannot serve the admin
    /// API's CreateTopics).
    pub fn start(topics: &Topics, partitions: i32, event_partitions: i32) -> KafkaResult<Self> {
        let mut config = ClientConfig::new();
        config.set("test.mock.num.brokers", "1");
        let client = Client::new(&config, config.create_native_config()?, RDKafkaType::RD_KAFKA_PRODUCER, DefaultProducerContext)?;
        let broker = Self { client };
        {
            let cluster = broker.cluster();
            for spec in topics.all() {
                let n = if spec.co_partitioned { partitions } else { event_partitions };
                cluster.create_topic(&spec.name, n, 1)?;
            }
        }
        Ok(broker)
    }

    /// Where the broker listens. (What it advertises in metadata can differ: see [`DevBroker::advertise`].)
    pub fn bootstrap_servers(&self) -> String {
        self.cluster().bootstrap_servers()
    }

    /// The mock cluster, for fault injection in tests.
    pub fn cluster(&self) -> MockCluster<'_, DefaultProducerContext> {
        self.client.mock_cluster().expect("a client with test.mock.num.brokers has a mock cluster")
    }

    /// Makes the broker advertise `host:port` in metadata instead of its own listener, while it keeps listening
    /// where it does: clients that bootstrap through a proxy at `host:port` (a TLS terminator in the tests) then
    /// keep talking through it.
    pub fn advertise(&self, host: &str, port: u16) -> KafkaResult<()> {
        let host = CString::new(host).map_err(|_| KafkaError::ClientCreation("host holds a NUL byte".into()))?;
        // SAFETY: the client (and so its mock cluster) outlives the call; a null cluster is checked; librdkafka
        // copies `host` under the cluster's lock. The mock cluster numbers its brokers from 1.
        unsafe {
            let cluster = rdkafka::bindings::rd_kafka_handle_mock_cluster(self.client.native_ptr());
            if cluster.is_null() {
                return Err(KafkaError::ClientCreation("the client has no mock cluster".into()));
            }
            rdkafka::bindings::rd_kafka_mock_broker_set_host_port(cluster, 1, host.as_ptr(), i32::from(port));
        }
        Ok(())
    }
}
