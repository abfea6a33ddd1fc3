//! Writing again the endpoint states a former owner's late record shadows: under compaction the fenced record,
//! being the key's last, would outlive the current state (`hookline_kafka::state::EndpointStates`). One task per
//! dispatcher, woken when an owned partition has such a key; each is written once, in order with the key's other
//! writes (enqueued under the table lock).

use std::sync::Arc;

use prost::Message as _;
use rdkafka::producer::FutureRecord;
use tokio_util::sync::CancellationToken;

use crate::Ctx;

pub async fn rewrite_shadowed(ctx: Arc<Ctx>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = ctx.states.shadowed_on_owned() => {}
            _ = stop.cancelled() => return,
        }
        for (partition, id) in ctx.states.take_shadowed() {
            let topic = ctx.topics.endpoint_state();
            let (enqueued, payload) = ctx.states.rewrite(&id, partition, |st| {
                let payload = st.map(|st| st.encode_to_vec());
                let record = FutureRecord::<str, [u8]>::to(topic).key(&id);
                let record = match &payload {
                    Some(p) => record.payload(p.as_slice()),
                    None => record,
                };
                (ctx.producer.send_result(record).ok(), payload)
            });
            let acked = match enqueued {
                Some(f) => matches!(f.await, Ok(Ok(_))),
                None => false,
            };
            let written = acked || ctx.produce_to_partition(topic, partition, &id, payload.as_deref()).await.is_ok();
            if written {
                metrics::counter!("hookline_endpoint_state_rewritten_total").increment(1);
                tracing::info!(subscription = %id, partition, tombstone = payload.is_none(), "endpoint state written again over a former owner's");
            }
        }
    }
}
