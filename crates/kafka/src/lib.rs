//! hookline's Kafka plumbing, shared by every binary: client settings (acks=all, idempotence, murmur2), topic
//! names and the retry-tier ladder, per-partition offset watermarks, compacted-table readers, producing with
//! acknowledgement, and the embedded mock broker for dev mode and tests.

pub mod aws;
pub mod budget;
pub mod client;
pub mod dead_letters;
pub mod event_record;
pub mod held;
mod listing;
pub mod mock;
pub mod oauth;
pub mod offset_reset;
pub mod produce;
pub mod producer;
pub mod rebalance;
pub mod scan;
pub mod settings;
pub mod state;
pub mod subscription_index;
pub mod table;
pub mod topics;
pub mod watermark;
pub mod worker;

pub use settings::KafkaSettings;
pub use topics::{Tier, Topics, TIERS};
