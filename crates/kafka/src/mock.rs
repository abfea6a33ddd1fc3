//! The embedded broker: librdkafka's mock cluster, speaking the Kafka protocol on 127.0.0.1 so separate
//! processes can use it. In-memory, no compaction, ~5 MiB per partition: for dev mode and tests only.

use rdkafka::error::KafkaResult;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

use crate::topics::Topics;

pub struct DevBroker {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl DevBroker {
    /// Starts a one-broker mock cluster and creates every hookline topic (the mock broker cannot serve the admin
    /// API's CreateTopics).
    pub fn start(topics: &Topics, partitions: i32, event_partitions: i32) -> KafkaResult<Self> {
        let cluster = MockCluster::new(1)?;
        for spec in topics.all() {
            let n = if spec.co_partitioned { partitions } else { event_partitions };
            cluster.create_topic(&spec.name, n, 1)?;
        }
        Ok(Self { cluster })
    }

    pub fn bootstrap_servers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// The mock cluster, for fault injection in tests.
    pub fn cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }
}
