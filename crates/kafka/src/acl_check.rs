//! The start-up check of a service's Kafka permissions: the broker says which operations the client's principal
//! may perform on each topic and group (KIP-430's authorized operations, through librdkafka's DescribeTopics and
//! DescribeConsumerGroups), and a service that lacks one stops at start with the resource and the operation named,
//! instead of failing on its first write minutes later. docs/operations.md ("ACLs") lists what each service needs.
//!
//! rust-rdkafka has no binding for these two admin calls, so they are made through librdkafka's C API here.
//! A broker that does not report authorized operations (librdkafka's mock cluster, or one without an authorizer
//! that answers an empty set) cannot be checked: the check then says so at debug level and lets the service start.

use std::ffi::{CStr, CString};
use std::fmt;
use std::time::Duration;

use rdkafka::bindings as rd;

use crate::settings::KafkaSettings;

/// What a service does on Kafka, one resource and operation at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub resource: Resource,
    pub operation: Operation,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Topic(String),
    Group(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Read,
    Write,
    Describe,
}

impl Operation {
    fn acl(self) -> rd::rd_kafka_AclOperation_t {
        match self {
            Operation::Read => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_READ,
            Operation::Write => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_WRITE,
            Operation::Describe => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_DESCRIBE,
        }
    }
}

impl Need {
    pub fn topic(name: impl Into<String>, operation: Operation) -> Self {
        Need { resource: Resource::Topic(name.into()), operation }
    }

    pub fn group(name: impl Into<String>, operation: Operation) -> Self {
        Need { resource: Resource::Group(name.into()), operation }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = match &self.resource {
            Resource::Topic(n) => ("topic", n),
            Resource::Group(n) => ("group", n),
        };
        write!(f, "{:?} on {kind} {name}", self.operation)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AclCheckError {
    #[error(
        "the Kafka principal lacks what this service needs: {} (grant them; docs/operations.md, \"ACLs\", lists each service's)",
        .missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Missing { missing: Vec<Need> },
    #[error("topics missing on the cluster: {} (create them: hookline topics create)", .topics.join(", "))]
    NoTopics { topics: Vec<String> },
    #[error("checking the Kafka principal's permissions: {0}")]
    Broker(String),
}

impl AclCheckError {
    /// A check that could not be made (the broker did not answer it) rather than one that failed.
    pub fn is_inconclusive(&self) -> bool {
        matches!(self, AclCheckError::Broker(_))
    }
}

/// Asks the broker what the principal may do and returns what it lacks of `needs`. A topic that does not exist
/// lacks everything asked of it (the message says so through the operation); describing is implied by the others.
pub async fn check(settings: &KafkaSettings, client_id: &str, needs: &[Need]) -> Result<(), AclCheckError> {
    // A topic created a moment ago may not be in every broker's metadata yet: asked again before it counts as missing.
    let mut tries = 0u32;
    loop {
        match check_once(settings, client_id, needs).await {
            Err(AclCheckError::NoTopics { .. }) if tries < 4 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

async fn check_once(settings: &KafkaSettings, client_id: &str, needs: &[Need]) -> Result<(), AclCheckError> {
    let admin = crate::client::admin(settings, client_id).map_err(|e| AclCheckError::Broker(e.to_string()))?;
    let needs = needs.to_vec();
    // An answer in seconds, as any metadata request; the same bound whatever the producer timeouts are.
    let timeout = Duration::from_secs(10);
    let missing = tokio::task::spawn_blocking(move || {
        let rk = admin.inner().native_ptr();
        let mut topics: Vec<&str> = needs
            .iter()
            .filter_map(|n| match &n.resource {
                Resource::Topic(t) => Some(t.as_str()),
                Resource::Group(_) => None,
            })
            .collect();
        topics.sort_unstable();
        topics.dedup();
        let mut groups: Vec<&str> = needs
            .iter()
            .filter_map(|n| match &n.resource {
                Resource::Group(g) => Some(g.as_str()),
                Resource::Topic(_) => None,
            })
            .collect();
        groups.sort_unstable();
        groups.dedup();
        // SAFETY: `rk` is the live handle of `admin`, which outlives both calls.
        let topic_ops = unsafe { describe(rk, Kind::Topics, &topics, timeout) }?;
        let group_ops = unsafe { describe(rk, Kind::Groups, &groups, timeout) }?;
        if topic_ops.iter().chain(&group_ops).all(|(_, ops)| matches!(ops, Allowed::NotReported)) {
            tracing::debug!("the broker reports no authorized operations: the permission check is skipped");
            return Ok(Vec::new());
        }
        let allowed = |n: &Need| {
            let (list, name) = match &n.resource {
                Resource::Topic(t) => (&topic_ops, t),
                Resource::Group(g) => (&group_ops, g),
            };
            match list.iter().find(|(r, _)| r == name).map(|(_, ops)| ops) {
                // Describing is implied by any other operation the broker reports.
                Some(Allowed::Ops(ops)) => {
                    ops.contains(&n.operation.acl()) || ops.contains(&rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ALL)
                }
                // A group not created yet (no member ever joined) has no operations to report.
                Some(Allowed::NotReported) | Some(Allowed::Absent) => true,
                Some(Allowed::Refused) | None => false,
            }
        };
        let absent: Vec<String> =
            topic_ops.iter().filter(|(_, ops)| matches!(ops, Allowed::Absent)).map(|(name, _)| name.clone()).collect();
        if !absent.is_empty() {
            return Err(AclCheckError::NoTopics { topics: absent });
        }
        Ok(needs.iter().filter(|n| !allowed(n)).cloned().collect::<Vec<_>>())
    })
    .await
    .map_err(|e| AclCheckError::Broker(e.to_string()))??;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(AclCheckError::Missing { missing })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Topics,
    Groups,
}

#[derive(Debug)]
enum Allowed {
    Ops(Vec<rd::rd_kafka_AclOperation_t>),
    /// The broker answered without operations: nothing to check against.
    NotReported,
    /// Not authorized to describe it: none of the operations is allowed.
    Refused,
    /// It does not exist (and the principal may describe it).
    Absent,
}

/// One DescribeTopics or DescribeConsumerGroups call with authorized operations.
///
/// # Safety
/// `rk` must be a live librdkafka handle for the duration of the call.
unsafe fn describe(
    rk: *mut rd::rd_kafka_t,
    kind: Kind,
    names: &[&str],
    timeout: Duration,
) -> Result<Vec<(String, Allowed)>, AclCheckError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let owned: Vec<CString> = names
        .iter()
        .map(|n| CString::new(*n).map_err(|_| AclCheckError::Broker(format!("{n:?}: a name with a NUL byte"))))
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const std::os::raw::c_char> = owned.iter().map(|c| c.as_ptr()).collect();
    let op = match kind {
        Kind::Topics => rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        Kind::Groups => rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
    };
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let queue = rd::rd_kafka_queue_new(rk);
    let options = rd::rd_kafka_AdminOptions_new(rk, op);
    let err = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options, 1);
    if !err.is_null() {
        rd::rd_kafka_error_destroy(err);
    }
    let mut errbuf = [0 as std::os::raw::c_char; 256];
    rd::rd_kafka_AdminOptions_set_request_timeout(options, timeout_ms, errbuf.as_mut_ptr(), errbuf.len());
    let collection = match kind {
        Kind::Topics => {
            let c = rd::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len());
            rd::rd_kafka_DescribeTopics(rk, c, options, queue);
            Some(c)
        }
        Kind::Groups => {
            rd::rd_kafka_DescribeConsumerGroups(rk, ptrs.as_mut_ptr(), ptrs.len(), options, queue);
            None
        }
    };
    // The answer, or nothing within the request timeout and a margin.
    let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(2_000));
    let result = if event.is_null() {
        Err(AclCheckError::Broker("no answer from the broker in time".into()))
    } else if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Err(AclCheckError::Broker(text(rd::rd_kafka_event_error_string(event))))
    } else {
        Ok(read_result(event, kind))
    };
    if !event.is_null() {
        rd::rd_kafka_event_destroy(event);
    }
    if let Some(c) = collection {
        rd::rd_kafka_TopicCollection_destroy(c);
    }
    rd::rd_kafka_AdminOptions_destroy(options);
    rd::rd_kafka_queue_destroy(queue);
    result
}

/// # Safety
/// `event` must be a live result event of `kind`.
unsafe fn read_result(event: *mut rd::rd_kafka_event_t, kind: Kind) -> Vec<(String, Allowed)> {
    let mut out = Vec::new();
    let mut count = 0usize;
    match kind {
        Kind::Topics => {
            let res = rd::rd_kafka_event_DescribeTopics_result(event);
            let items = rd::rd_kafka_DescribeTopics_result_topics(res, &mut count);
            for i in 0..count {
                let d = *items.add(i);
                let name = text(rd::rd_kafka_TopicDescription_name(d));
                let error = rd::rd_kafka_TopicDescription_error(d);
                let mut n = 0usize;
                let ops = rd::rd_kafka_TopicDescription_authorized_operations(d, &mut n);
                out.push((name, allowed(error, ops, n)));
            }
        }
        Kind::Groups => {
            let res = rd::rd_kafka_event_DescribeConsumerGroups_result(event);
            let items = rd::rd_kafka_DescribeConsumerGroups_result_groups(res, &mut count);
            for i in 0..count {
                let d = *items.add(i);
                let name = text(rd::rd_kafka_ConsumerGroupDescription_group_id(d));
                let error = rd::rd_kafka_ConsumerGroupDescription_error(d);
                let mut n = 0usize;
                let ops = rd::rd_kafka_ConsumerGroupDescription_authorized_operations(d, &mut n);
                out.push((name, allowed(error, ops, n)));
            }
        }
    }
    out
}

/// # Safety
/// `ops` must point at `n` operations (or be null).
unsafe fn allowed(error: *const rd::rd_kafka_error_t, ops: *const rd::rd_kafka_AclOperation_t, n: usize) -> Allowed {
    use rd::rd_kafka_resp_err_t as E;
    if !error.is_null() {
        match rd::rd_kafka_error_code(error) {
            E::RD_KAFKA_RESP_ERR_NO_ERROR => {}
            E::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED | E::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED => return Allowed::Refused,
            E::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART | E::RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND => return Allowed::Absent,
            // Anything else (a coordinator loading or moving, a leader election) says nothing about permissions.
            _ => return Allowed::NotReported,
        }
    }
    if ops.is_null() || n == 0 {
        return Allowed::NotReported;
    }
    Allowed::Ops(std::slice::from_raw_parts(ops, n).to_vec())
}

/// # Safety
/// `p` must be null or a NUL-terminated string.
unsafe fn text(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// What ingest does on Kafka (docs/operations.md, "ACLs"): the fan-out's group on `events`, the notifier's on `ops`
/// (when it runs), the delivery log's indexer's on `attempts`, `dlq` and `events` (when it runs here), the tables it
/// reads whole, and the topics the API and the fan-out write.
pub fn ingest_needs(topics: &crate::Topics, fanout_group: &str, notify_group: Option<&str>, indexer_group: Option<&str>) -> Vec<Need> {
    use Operation::{Read, Write};
    let mut n = vec![Need::group(fanout_group, Read), Need::topic(topics.events(), Read)];
    if let Some(g) = notify_group {
        n.extend([Need::group(g, Read), Need::topic(topics.ops(), Read)]);
    }
    if let Some(g) = indexer_group {
        n.extend([Need::group(g, Read), Need::topic(topics.attempts(), Read), Need::topic(topics.dlq(), Read)]);
    }
    for t in [
        topics.subscriptions(),
        topics.endpoint_state(),
        topics.tenants(),
        topics.api_keys(),
        topics.event_types(),
        topics.dlq(),
        topics.attempts(),
    ] {
        n.push(Need::topic(t, Read));
    }
    for t in [
        topics.events(),
        topics.deliveries(),
        topics.dlq(),
        topics.subscriptions(),
        topics.tenants(),
        topics.api_keys(),
        topics.event_types(),
    ] {
        n.push(Need::topic(t, Write));
    }
    dedup(n)
}

/// What a dispatcher does on Kafka (docs/operations.md, "ACLs").
pub fn dispatcher_needs(topics: &crate::Topics, group: &str) -> Vec<Need> {
    use Operation::{Read, Write};
    let mut n = vec![Need::group(group, Read), Need::topic(topics.deliveries(), Read)];
    for t in [topics.subscriptions(), topics.endpoint_state(), topics.attempts(), topics.inflight(), topics.ordered()] {
        n.push(Need::topic(t, Read));
    }
    for t in [
        topics.attempts(),
        topics.held(),
        topics.ordered(),
        topics.deliveries(),
        topics.dlq(),
        topics.events(),
        topics.endpoint_state(),
        topics.ops(),
        topics.inflight(),
    ] {
        n.push(Need::topic(t, Write));
    }
    n.extend(crate::TIERS.iter().map(|tier| Need::topic(topics.retry(tier), Write)));
    dedup(n)
}

/// What a retry-scheduler does on Kafka (docs/operations.md, "ACLs").
pub fn retry_scheduler_needs(topics: &crate::Topics, group: &str) -> Vec<Need> {
    use Operation::{Read, Write};
    let mut n = vec![Need::group(group, Read), Need::topic(topics.held(), Read)];
    for t in [topics.subscriptions(), topics.endpoint_state(), topics.parked()] {
        n.push(Need::topic(t, Read));
    }
    for t in [topics.deliveries(), topics.parked(), topics.dlq()] {
        n.push(Need::topic(t, Write));
    }
    for tier in crate::TIERS.iter() {
        n.extend([Need::topic(topics.retry(tier), Read), Need::topic(topics.retry(tier), Write)]);
    }
    dedup(n)
}

fn dedup(mut n: Vec<Need>) -> Vec<Need> {
    n.sort_by(|a, b| (&a.resource, a.operation).cmp(&(&b.resource, b.operation)));
    n.dedup();
    n
}

/// Runs [`check`] for a service at start: a definite lack is the service's error; a check the broker could not
/// answer is logged and the service starts (its first use of the resource will say more).
pub async fn at_start(settings: &KafkaSettings, client_id: &str, needs: &[Need]) -> Result<(), AclCheckError> {
    if !settings.check_acls_at_start {
        return Ok(());
    }
    match check(settings, client_id, needs).await {
        Err(e) if e.is_inconclusive() => {
            tracing::warn!(error = %e, "the Kafka permission check could not be made; starting anyway");
            Ok(())
        }
        other => other,
    }
}
