//! The pipeline against Apache Kafka: real KRaft brokers, the group coordinator, long-poll fetches, ACLs and the
//! secured listeners — what neither the embedded mock broker nor tansu exercises. The cluster is the run's, named
//! by `HOOKLINE_TEST_KAFKA` (support.rs, [`ExternalKafka`]); scripts/test starts one with `scripts/kafka start` and
//! shares it between these tests, each working under a fresh topic prefix with consumer groups of its own.
//! Without the variable every test skips, saying so (unless `HOOKLINE_TEST_REQUIRE_KAFKA` is set).
//!
//! `cargo test -p hookline-tests --test integration apache_kafka::` runs them; scripts/kafka's JSON line says what
//! the listeners, users and certificates are.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hookline_kafka::settings::{SaslMechanism, SecurityProtocol};
use hookline_kafka::Topics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::pipeline::{self, quick_policy};
use crate::support::{wait_for, ExternalKafka};

const LIMIT: Duration = Duration::from_secs(60);

/// The tests share the cluster, except the one that kills a node: it has the cluster alone (the others would find
/// a broker down while they create topics), and restarts the node before it lets them go on.
static CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The run's cluster, shared with the other tests (see [`CLUSTER`]).
async fn shared() -> Option<(ExternalKafka, tokio::sync::RwLockReadGuard<'static, ()>)> {
    let k = ExternalKafka::from_env()?;
    Some((k, CLUSTER.read().await))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_fans_out_by_filter_and_signs_every_request() {
    let Some((k, _shared)) = shared().await else { return };
    let p = k.pipeline(2, |_| {}).await;
    let finals = pipeline::fans_out_by_filter_and_signs_every_request_on(&p).await;
    // Every final record names its event, subscription and delivery: the attempts topic is the delivery log's input.
    assert!(finals.iter().all(|a| !a.event_id.is_empty() && !a.delivery_id.is_empty() && a.attempt == 1), "{finals:?}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_cloudevents_from_the_sdk_are_delivered_filtered_ignored_or_dead_lettered() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(py) = crate::support::python() else { return };
    crate::cloudevents::cloudevents_from_the_sdk_on_kafka_on(k.pipeline(2, |_| {}).await, &py).await;
}

/// Ordering by key on a real broker: a failing head parks its key's later deliveries on the `ordered` topic (read
/// back by offset when the head concludes) while other keys flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_failing_key_holds_only_its_own_later_events_while_other_keys_flow() {
    let Some((k, _shared)) = shared().await else { return };
    crate::ordering::a_failing_key_holds_only_its_own_later_events_while_other_keys_flow_on(k.pipeline(2, |_| {}).await).await;
}

/// Scaling out and in on a real group coordinator (cooperative-sticky, with the revoke drain): only the partitions
/// that change owner move, and each event is delivered once, although here commits during a rebalance succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_scaling_out_and_in_moves_only_the_partitions_that_change_owner_and_delivers_each_event_once() {
    let Some((k, _shared)) = shared().await else { return };
    let p = k.pipeline_without_dispatcher(crate::rebalance::PARTITIONS, crate::rebalance::revoke_drain).await;
    crate::rebalance::scaling_out_and_in_moves_only_the_partitions_that_change_owner_and_delivers_each_event_once_on(p).await;
}

/// The same, with KIP-848's consumer group protocol: the broker computes the assignment, incrementally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_scaling_out_and_in_with_the_consumer_group_protocol_moves_only_what_changes_owner() {
    let Some((k, _shared)) = shared().await else { return };
    let p = k
        .pipeline_without_dispatcher(crate::rebalance::PARTITIONS, |c| {
            crate::rebalance::revoke_drain(c);
            c.kafka.group_protocol = hookline_kafka::settings::GroupProtocol::Consumer;
        })
        .await;
    crate::rebalance::scaling_out_and_in_moves_only_the_partitions_that_change_owner_and_delivers_each_event_once_on(p).await;
}

/// The zombie fence on a real group coordinator: a member whose loop stops polling is dropped after
/// `max.poll.interval.ms` and sends nothing once its partitions moved; the other member delivers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_member_that_stops_polling_sends_nothing_once_dropped_and_the_other_delivers_everything() {
    let Some((k, _shared)) = shared().await else { return };
    let p = k
        .pipeline_without_dispatcher(crate::zombie::PARTITIONS, |c| {
            crate::zombie::zombie_config(c);
            c.kafka.session_timeout_ms = 6_000;
        })
        .await;
    crate::zombie::a_member_that_stops_polling_sends_nothing_once_dropped_and_the_other_delivers_everything_on(p).await;
}

/// The same with KIP-848's consumer group protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_with_the_consumer_group_protocol_a_member_that_stops_polling_sends_nothing_once_dropped() {
    let Some((k, _shared)) = shared().await else { return };
    let p = k
        .pipeline_without_dispatcher(crate::zombie::PARTITIONS, |c| {
            crate::zombie::zombie_config(c);
            c.kafka.group_protocol = hookline_kafka::settings::GroupProtocol::Consumer;
        })
        .await;
    crate::zombie::a_member_that_stops_polling_sends_nothing_once_dropped_and_the_other_delivers_everything_on(p).await;
}

/// Endpoint-state writes fenced by owner epoch, on a real broker: a former owner's late write is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_former_owners_late_endpoint_state_is_ignored_by_the_api_and_the_next_owner() {
    let Some((k, _shared)) = shared().await else { return };
    let p = k.pipeline_without_dispatcher(1, |_| {}).await;
    crate::fencing::a_former_owners_late_endpoint_state_is_ignored_by_the_api_and_the_next_owner_on(p).await;
}

/// Two tenants publishing the same event id each keep their own event, through the log, resends and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_same_event_id_from_two_tenants_stays_each_tenants() {
    let Some((k, _shared)) = shared().await else { return };
    crate::tenants::the_same_event_id_from_two_tenants_stays_each_tenants(k.pipeline(2, |_| {}).await).await;
}

/// The delivery log on a real broker: an attempt's detail (headers, the verdict's reasoning), and a resend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_delivery_log_keeps_each_attempt_and_a_resend_arrives_with_the_same_event_id() {
    let Some((k, _shared)) = shared().await else { return };
    crate::delivery_log::attempt_detail_keeps_headers_and_reasoning(k.pipeline(2, |_| {}).await).await;
    crate::delivery_log::a_delivery_that_succeeded_is_resent_and_arrives_with_the_same_event_id_on(k.pipeline(2, |_| {}).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_retries_go_through_the_tiers_and_are_never_early() {
    let Some((k, _shared)) = shared().await else { return };
    pipeline::retries_follow_the_schedule_and_are_never_early_on(k.pipeline(2, |_| {}).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_terminal_and_exhausted_deliveries_reach_the_dead_letter_topic() {
    let Some((k, _shared)) = shared().await else { return };
    pipeline::terminal_and_exhausted_deliveries_reach_the_dead_letter_topic_on(k.pipeline(2, |_| {}).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_malformed_events_are_dead_lettered_without_stalling_the_partition() {
    let Some((k, _shared)) = shared().await else { return };
    pipeline::malformed_events_are_dead_lettered_without_stalling_the_partition_on(k.pipeline(1, |_| {}).await).await;
}

/// The services stop (drain, commit, leave their groups) while deliveries are under way and retries wait in a tier,
/// and new ones start on the same topics and groups: every event published before and after reaches both
/// subscriptions and ends succeeded. Redelivery is allowed (at least once), loss is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_restart_of_the_services_loses_nothing() {
    let Some((k, _shared)) = shared().await else { return };
    let prefix = ExternalKafka::fresh_prefix();
    k.create_topics(&prefix, 2, &[]).await;
    let p = k.pipeline_on(&prefix, 2, |_| {}).await;
    // The first 20 requests to `flaky` fail: their retries are in the 1 s tier when the services stop.
    let mut script = vec![Some((503, None)); 20];
    script.push(Some((200, None)));
    p.script("flaky", script);
    let toml = quick_policy(&[1.0, 1.0], |_| {});
    let (ok, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    let (flaky, _) = p.subscribe(json!({"url": p.url("flaky"), "event_types": ["*"], "policy_toml": toml})).await;
    let ids: Vec<String> = (0..40).map(|i| format!("evt_rs{i}")).collect();
    for id in &ids[..20] {
        p.publish(id, "thing.happened").await;
    }
    let seen = p.seen.clone();
    wait_for(&p.seen.changed, LIMIT, "the first deliveries", || seen.requests.lock().unwrap().len() >= 10).await;
    let secrets = p.config.secrets.clone();
    // The receiver outlives the services (the subscriptions' URLs name it).
    let received = p.seen.clone();
    tokio::time::timeout(LIMIT, p.stop()).await.expect("the services stop in time");

    let p = k.pipeline_on(&prefix, 2, |c| c.secrets = secrets).await;
    for id in &ids[20..] {
        p.publish(id, "thing.happened").await;
    }
    // The new pipeline's collector reads the attempts topic from its beginning: the records of both runs.
    let attempts = p.attempts.clone();
    let want: HashSet<(String, String)> = ids.iter().flat_map(|e| [(ok.clone(), e.clone()), (flaky.clone(), e.clone())]).collect();
    let done = |a: &hookline_core::model::AttemptRecord| a.final_state == "succeeded";
    wait_for(&p.attempts.changed, Duration::from_secs(90), "a succeeded final state for every event and subscription", || {
        let got: HashSet<(String, String)> =
            attempts.items.lock().unwrap().iter().filter(|a| done(a)).map(|a| (a.subscription_id.clone(), a.event_id.clone())).collect();
        want.is_subset(&got)
    })
    .await;
    let requests = received.requests.lock().unwrap().clone();
    for path in ["ok", "flaky"] {
        let got: HashSet<String> = requests
            .iter()
            .filter(|r| r.path == path)
            .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok()?["id"].as_str().map(str::to_owned))
            .collect();
        let missing: Vec<&String> = ids.iter().filter(|id| !got.contains(*id)).collect();
        assert!(missing.is_empty(), "{path} never received {missing:?}");
    }
    assert!(p.finals().iter().all(|a| a.final_state == "succeeded"), "{:?}", p.finals());
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// The secured listeners: SASL_SSL with SCRAM-SHA-512, and TLS with client certificates. Topics are created over
// PLAINTEXT; everything hookline does goes through the secured listener as a principal with ACLs (User:hookline
// may do anything on topics and groups starting with `hookline`), and a principal without ACLs is refused.

fn file(v: &serde_json::Value) -> PathBuf {
    PathBuf::from(v.as_str().expect("a path in the cluster's JSON"))
}

/// The cluster's secured listeners, or `None` (the test skips) when the variable gave only bootstrap servers.
fn secured(k: &ExternalKafka) -> Option<&serde_json::Value> {
    if k.info.get("sasl_ssl").is_none() {
        eprintln!("skipped: {} gives no secured listeners (only scripts/kafka's JSON line does)", crate::support::KAFKA_ENV);
        return None;
    }
    Some(&k.info)
}

/// Points `c` at the SASL_SSL listener as SCRAM-SHA-512 user `user`, with the password from `password_file`.
fn use_scram(c: &mut hookline_service::Config, info: &serde_json::Value, user: &str, password_file: PathBuf) {
    c.kafka.bootstrap_servers = info["sasl_ssl"]["bootstrap_servers"].as_str().unwrap().to_owned();
    c.kafka.security_protocol = SecurityProtocol::SaslSsl;
    c.kafka.tls.ca_file = Some(file(&info["ca_file"]));
    c.kafka.sasl.mechanism = Some(SaslMechanism::ScramSha512);
    c.kafka.sasl.username = Some(user.to_owned());
    c.kafka.sasl.password_file = Some(password_file);
}

/// Points `c` at the mTLS listener with the client certificate of `user` (its CN is the principal), or none.
fn use_mtls(c: &mut hookline_service::Config, info: &serde_json::Value, user: Option<&str>) {
    c.kafka.bootstrap_servers = info["ssl"]["bootstrap_servers"].as_str().unwrap().to_owned();
    c.kafka.security_protocol = SecurityProtocol::Ssl;
    c.kafka.tls.ca_file = Some(file(&info["ca_file"]));
    if let Some(user) = user {
        c.kafka.tls.cert_file = Some(file(&info["ssl"]["clients"][user]["cert_file"]));
        c.kafka.tls.key_file = Some(file(&info["ssl"]["clients"][user]["key_file"]));
    }
}

/// The whole pipeline through the secured listener `edit` sets: an event fails once, goes through the
/// retry-scheduler and arrives; the services then stop cleanly over the same connections.
async fn pipeline_secured(k: &ExternalKafka, edit: impl Fn(&mut hookline_service::Config)) {
    // The topics too are created as the principal (CreateTopics needs Create on them).
    let prefix = ExternalKafka::fresh_prefix();
    let mut c = base_config(k);
    edit(&mut c);
    crate::support::create_topics(&c.kafka, &prefix, 2, k.replication(), &[]).await;
    let p = k.pipeline_on(&prefix, 2, edit).await;
    assert_ne!(p.config.kafka.security_protocol, SecurityProtocol::Plaintext);
    let toml = quick_policy(&[1.0], |_| {});
    p.script("secured", vec![Some((503, None)), Some((200, None))]);
    let (id, _) = p.subscribe(json!({"url": p.url("secured"), "event_types": ["*"], "policy_toml": toml})).await;
    p.publish("evt_sec1", "order.created").await;
    let attempts = p.wait_final_of(&id, 1, LIMIT).await;
    assert_eq!(p.requests_to("secured").len(), 2, "a failure, then the retry's success");
    let last = attempts.last().unwrap();
    assert_eq!((last.attempt, last.final_state.as_str()), (2, "succeeded"), "{attempts:?}");
    tokio::time::timeout(LIMIT, p.stop()).await.expect("the services stop in time");
}

/// What producing one record to a fresh hookline topic with `config`'s connection ends in.
async fn produce_one(k: &ExternalKafka, config: &hookline_service::Config) -> Result<(i32, i64), String> {
    let prefix = ExternalKafka::fresh_prefix();
    k.create_topics(&prefix, 1, &[]).await;
    let mut settings = config.kafka.clone();
    settings.delivery_timeout_ms = 10_000;
    let producer = hookline_kafka::client::producer(&settings, "acl-probe").map_err(|e| e.to_string())?;
    let topic = Topics::new(prefix).subscriptions().to_owned();
    let sent = tokio::time::timeout(LIMIT, hookline_kafka::produce::send(&producer, &topic, "k", b"v")).await;
    sent.expect("the produce ends in time").map_err(|e| format!("{e:?}"))
}

/// Ingest alone with `config`: its start error and how long it took to fail.
async fn ingest_start_error(config: hookline_service::Config) -> (String, Duration) {
    let started = Instant::now();
    let shutdown = CancellationToken::new();
    let result = tokio::time::timeout(LIMIT, hookline_ingest::run(config, shutdown.clone(), Default::default())).await;
    shutdown.cancel();
    match result {
        Ok(Err(e)) => (e.to_string(), started.elapsed()),
        Ok(Ok(())) => panic!("ingest started without a working connection"),
        Err(_) => panic!("ingest neither started nor failed within {LIMIT:?}"),
    }
}

fn base_config(k: &ExternalKafka) -> hookline_service::Config {
    let mut c = hookline_service::Config::dev(&k.bootstrap, 1, crate::support::TOKEN);
    c.kafka.check_acls_at_start = true;
    crate::support::use_prefix(&mut c, &ExternalKafka::fresh_prefix());
    c.telemetry.log_level = "warn".into();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_pipeline_works_over_sasl_ssl_with_scram_sha_512() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = secured(&k) else { return };
    let password = file(&info["sasl_ssl"]["users"]["hookline"]["password_file"]);
    pipeline_secured(&k, |c| use_scram(c, info, "hookline", password.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_sasl_ssl_refuses_a_wrong_password_and_a_principal_without_acls() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = secured(&k) else { return };
    // A wrong password: ingest fails at start, fast, and says where to look.
    let wrong = crate::support::temp_dir("scram").join("wrong.password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let mut c = base_config(&k);
    use_scram(&mut c, info, "hookline", wrong);
    let (e, took) = ingest_start_error(c).await;
    assert!(e.contains("SASL authentication with the broker failed"), "{e}");
    assert!(took < Duration::from_secs(15), "took {took:?}: {e}");

    // The right user writes; an authenticated user without ACLs is refused.
    let mut c = base_config(&k);
    use_scram(&mut c, info, "hookline", file(&info["sasl_ssl"]["users"]["hookline"]["password_file"]));
    produce_one(&k, &c).await.expect("User:hookline may write hookline topics");
    let mut c = base_config(&k);
    use_scram(&mut c, info, "stranger", file(&info["sasl_ssl"]["users"]["stranger"]["password_file"]));
    let e = produce_one(&k, &c).await.expect_err("User:stranger has no ACL");
    assert!(e.contains("TopicAuthorizationFailed") || e.contains("authoriz"), "{e}");
}

/// The MSK IAM listener (scripts/kafka's SASL_SSL with OAUTHBEARER checked by `MskIamValidator`), or `None` (the test
/// skips) when the cluster has none (started without javac, or bootstrap servers only).
fn msk_iam(k: &ExternalKafka) -> Option<&serde_json::Value> {
    if k.info.get("msk_iam").is_none() {
        eprintln!("skipped: the cluster has no MSK IAM listener (scripts/kafka compiles its validator with javac)");
        return None;
    }
    // hookline takes AWS credentials from the process's environment here (the first source of the AWS chain). Only
    // these tests read AWS_*, and they all set the same values.
    let user = &k.info["msk_iam"]["users"]["hookline"];
    std::env::set_var("AWS_ACCESS_KEY_ID", user["access_key_id"].as_str().unwrap());
    std::env::set_var("AWS_SECRET_ACCESS_KEY", user["secret_access_key"].as_str().unwrap());
    std::env::set_var("AWS_SESSION_TOKEN", "hookline-test-session/token+==");
    Some(&k.info)
}

/// Points `c` at the MSK IAM listener with tokens signed for `region`.
fn use_msk_iam(c: &mut hookline_service::Config, info: &serde_json::Value, region: &str) {
    c.kafka.bootstrap_servers = info["msk_iam"]["bootstrap_servers"].as_str().unwrap().to_owned();
    c.kafka.security_protocol = SecurityProtocol::SaslSsl;
    c.kafka.tls.ca_file = Some(file(&info["ca_file"]));
    c.kafka.sasl.mechanism = Some(SaslMechanism::AwsMskIam);
    c.kafka.aws.region = Some(region.to_owned());
}

/// Topics created, and the whole pipeline run, as `User:hookline` authenticated by MSK IAM tokens: every client's
/// token is a SigV4-presigned URL the broker's validator checks against the access key's secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_pipeline_works_with_msk_iam_tokens() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = msk_iam(&k) else { return };
    let region = info["msk_iam"]["region"].as_str().unwrap().to_owned();
    pipeline_secured(&k, |c| use_msk_iam(c, info, &region)).await;
}

/// A token signed for another region than the cluster's is refused: ingest stops at start with the SASL message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_msk_iam_refuses_a_token_for_another_region() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = msk_iam(&k) else { return };
    assert_ne!(info["msk_iam"]["region"], "us-east-1");
    let mut c = base_config(&k);
    use_msk_iam(&mut c, info, "us-east-1");
    let (e, took) = ingest_start_error(c).await;
    assert!(e.contains("SASL authentication with the broker failed") && e.contains("kafka.aws.*"), "{e}");
    assert!(took < Duration::from_secs(15), "took {took:?}: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_pipeline_works_over_mutual_tls() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = secured(&k) else { return };
    pipeline_secured(&k, |c| use_mtls(c, info, Some("hookline"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_mutual_tls_refuses_no_certificate_and_a_principal_without_acls() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = secured(&k) else { return };
    let mut c = base_config(&k);
    use_mtls(&mut c, info, None);
    let (e, took) = ingest_start_error(c).await;
    assert!(e.contains("the TLS handshake with the broker failed"), "{e}");
    assert!(took < Duration::from_secs(15), "took {took:?}: {e}");

    let mut c = base_config(&k);
    use_mtls(&mut c, info, Some("stranger"));
    let e = produce_one(&k, &c).await.expect_err("User:stranger has no ACL");
    assert!(e.contains("TopicAuthorizationFailed") || e.contains("authoriz"), "{e}");
}

/// The state topics compacted by the broker's log cleaner (segments rolled every 100 ms, any dirty ratio): a
/// subscription changed five times keeps one record, and services started after the compaction rebuild the same
/// subscriptions (the latest URL, the deleted one gone) and deliver by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_services_restarted_after_compaction_rebuild_the_same_subscriptions() {
    let Some((k, _shared)) = shared().await else { return };
    let prefix = ExternalKafka::fresh_prefix();
    k.create_topics(&prefix, 1, &COMPACTING).await;
    let p = k.pipeline_on(&prefix, 1, |_| {}).await;
    let (a, _) = p.subscribe(json!({"url": p.url("a0"), "event_types": ["*"]})).await;
    for i in 1..=5 {
        // Each version in a segment of its own: the cleaner only compacts segments that were rolled.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{a}"), Some(json!({"url": p.url(&format!("a{i}"))}))).await;
        assert_eq!(status, 200, "{v}");
    }
    let (gone, _) = p.subscribe(json!({"url": p.url("gone"), "event_types": ["*"]})).await;
    let (status, _) = p.call("DELETE", &format!("/v1/subscriptions/{gone}"), None).await;
    assert_eq!(status, 204);
    let (b, _) = p.subscribe(json!({"url": p.url("b"), "event_types": ["*"]})).await;

    let topic = Topics::new(prefix.clone()).subscriptions().to_owned();
    let deadline = Instant::now() + LIMIT;
    let (mut records_of_a, mut records_of_gone);
    loop {
        (records_of_a, records_of_gone) = (0, 0);
        hookline_kafka::scan::scan(&k.admin_settings(), &topic, None, LIMIT, |m| {
            use rdkafka::Message as _;
            if m.key() == Some(a.as_bytes()) {
                records_of_a += 1;
            }
            if m.key() == Some(gone.as_bytes()) {
                records_of_gone += 1;
            }
        })
        .await
        .expect("scan the subscriptions topic");
        // A's versions compacted to its latest, and the deleted one's tombstone itself removed
        // (`delete.retention.ms`): nothing of it is left for a new reader to see.
        if records_of_a == 1 && records_of_gone == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{records_of_a} records of {a} and {records_of_gone} of the deleted {gone} after {LIMIT:?}: the log cleaner did not compact"
        );
        // A later record rolls the segment that holds the last ones, so the cleaner may take them too.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{b}"), Some(json!({"url": p.url("b")}))).await;
        assert_eq!(status, 200, "{v}");
    }
    let latest = p.url("a5");
    let secrets = p.config.secrets.clone();
    let received = p.seen.clone();
    tokio::time::timeout(LIMIT, p.stop()).await.expect("the services stop in time");

    let p = k.pipeline_on(&prefix, 1, |c| c.secrets = secrets).await;
    let v = p.subscription_when(&a, |v| v["url"].is_string()).await;
    assert_eq!(v["url"], latest.as_str(), "{v}");
    let (status, _) = p.call("GET", &format!("/v1/subscriptions/{gone}"), None).await;
    assert_eq!(status, 404, "the deleted subscription stays deleted");
    p.publish("evt_after_compaction", "thing.happened").await;
    p.wait_finals(2, LIMIT).await;
    let finals = p.finals();
    let mut got: Vec<&str> = finals.iter().map(|f| f.subscription_id.as_str()).collect();
    got.sort_unstable();
    let mut want = [a.as_str(), b.as_str()];
    want.sort_unstable();
    assert_eq!(got, want, "{finals:?}");
    let paths: Vec<String> = received.requests.lock().unwrap().iter().map(|r| r.path.clone()).collect();
    let mut paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    paths.sort_unstable();
    assert_eq!(paths, ["a5", "b"], "only the latest URL of A, and B");
    p.stop().await;
}

/// What the compaction tests give the state topics: segments rolled every 100 ms, any dirty ratio, tombstones kept
/// 100 ms, so the log cleaner (scripts/kafka: every second) compacts during the test.
const COMPACTING: [(&str, &str); 4] =
    [("segment.ms", "100"), ("min.cleanable.dirty.ratio", "0.01"), ("min.compaction.lag.ms", "0"), ("delete.retention.ms", "100")];

/// Each key's values on `topic` (`None`: a tombstone), in log order.
async fn values_by_key(k: &ExternalKafka, topic: &str) -> std::collections::HashMap<String, Vec<Option<Vec<u8>>>> {
    let mut out = std::collections::HashMap::<String, Vec<Option<Vec<u8>>>>::new();
    hookline_kafka::scan::scan(&k.admin_settings(), topic, None, LIMIT, |m| {
        use rdkafka::Message as _;
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        out.entry(key).or_default().push(m.payload().map(<[u8]>::to_vec));
    })
    .await
    .expect("scan a state topic");
    out
}

/// A tombstone for a key no reader knows, on every compacted topic: it rolls the segment holding the records
/// before it (the cleaner never touches the active segment).
async fn roll_compacted_segments(k: &ExternalKafka, prefix: &str) {
    let producer = hookline_kafka::client::producer(&k.admin_settings(), "roll-segments").unwrap();
    for spec in Topics::new(prefix).all().iter().filter(|s| s.cleanup == hookline_kafka::topics::Cleanup::Compact) {
        hookline_kafka::produce::send_tombstone(&producer, &spec.name, "\u{0}roll").await.unwrap();
    }
}

/// Tenants, API keys, endpoint state (fenced against a former owner's late write) and parked positions, each
/// written several times, compacted by the log cleaner; services started after it rebuild the same state: the
/// tenant's latest name and the deleted one gone, the live key accepted and the revoked one refused, the endpoint
/// paused for its failures (not the former owner's "healthy" the cleaner would otherwise have kept), and parked
/// deliveries released on resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_services_restarted_after_compaction_rebuild_tenants_keys_endpoint_state_and_parked_deliveries() {
    use hookline_core::model::{EndpointCondition, EndpointState};
    use prost::Message as _;
    let Some((k, _shared)) = shared().await else { return };
    let prefix = ExternalKafka::fresh_prefix();
    k.create_topics(&prefix, 1, &COMPACTING).await;
    let p = k.pipeline_on(&prefix, 1, |_| {}).await;
    let topics = Topics::new(prefix.clone());

    // Tenants: one renamed three times, one deleted. Keys: one used, one revoked.
    p.tenant("keep").await;
    for name in ["Keep 1", "Keep 2", "Keep 3"] {
        let (status, v) = p.call("PATCH", "/v1/tenants/keep", Some(json!({"name": name}))).await;
        assert_eq!(status, 200, "{v}");
    }
    p.tenant("gone").await;
    let (status, v) = p.call("DELETE", "/v1/tenants/gone", None).await;
    assert_eq!(status, 200, "{v}");
    let (live_id, live) = p.api_key("keep").await;
    let (revoked_id, revoked) = p.api_key("keep").await;
    assert_eq!(p.call_as(Some(&revoked), "GET", "/v1/tenants/keep", None).await.0, 200);
    let (status, v) = p.call("DELETE", &format!("/v1/tenants/keep/api-keys/{revoked_id}"), None).await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(p.call_as(Some(&live), "GET", "/v1/tenants/keep", None).await.0, 200);

    // Endpoint state: LuciBook scaled down pauses the endpoint after two failures; the event after is held.
    let mut lb = hookline_core::policy::builtin("lucibook").unwrap();
    lb.schedule.waits_s = Some(vec![1.0]);
    lb.schedule.max_attempts = Some(1);
    lb.disable.as_mut().unwrap().after_consecutive_failures = Some(2);
    p.script("sick", vec![Some((500, None)), Some((500, None)), Some((204, None))]);
    let (sick, _) =
        p.subscribe(json!({"url": p.url("sick"), "event_types": ["sick.*"], "policy_toml": toml::to_string(&lb).unwrap()})).await;
    for i in 0..2 {
        p.publish(&format!("evt_sick{i}"), "sick.happened").await;
        p.wait_final_of(&sick, i + 1, LIMIT).await;
    }
    p.subscription_when(&sick, |v| v["state"] == "paused").await;
    p.publish("evt_sick_held", "sick.happened").await;

    // Parked positions: held, released, held again (the topic has a position, its tombstone, a position).
    let parked = crate::parking::paused(&p, "parked", "parked.happened").await;
    p.publish("evt_parked0", "parked.happened").await;
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{parked}/resume"), None).await;
    assert_eq!(status, 200);
    p.wait_final_of(&parked, 1, LIMIT).await;
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{parked}/pause"), None).await;
    assert_eq!(status, 200);
    p.publish("evt_parked1", "parked.happened").await;
    p.publish("evt_parked2", "parked.happened").await;

    // A former owner, late, writes the endpoint healthy: ignored, and the owner writes the paused state again.
    let epoch = *crate::fencing::fences(&p).await.last().expect("the dispatcher fenced the partition");
    let late = EndpointState { subscription_id: sick.clone(), owner_epoch: epoch - 1, ..Default::default() };
    let producer = hookline_kafka::client::producer(&k.admin_settings(), "former-owner").unwrap();
    hookline_kafka::produce::send(&producer, topics.endpoint_state(), &sick, &late.encode_to_vec()).await.unwrap();

    // Until the cleaner has taken every earlier version (and the tombstones themselves).
    let deadline = Instant::now() + LIMIT;
    loop {
        let tenants = values_by_key(&k, topics.tenants()).await;
        let keys = values_by_key(&k, topics.api_keys()).await;
        let states = values_by_key(&k, topics.endpoint_state()).await;
        let positions = values_by_key(&k, topics.parked()).await;
        let count = |m: &std::collections::HashMap<String, Vec<Option<Vec<u8>>>>, key: &str| m.get(key).map_or(0, Vec::len);
        let live_positions = positions.get(&parked).map_or(0, |v| v.iter().filter(|v| v.is_some()).count());
        let compacted = count(&tenants, "keep") == 1
            && count(&tenants, "gone") == 0
            && count(&keys, &live_id) == 1
            && count(&keys, &revoked_id) == 0
            && count(&states, &sick) == 1
            && count(&positions, &parked) == 1
            && live_positions == 1;
        if compacted {
            let last = EndpointState::decode(states[&sick][0].as_deref().unwrap_or_default()).unwrap();
            assert_eq!(
                (last.condition, last.owner_epoch),
                (EndpointCondition::Paused as i32, epoch),
                "the endpoint's record left after compaction is its owner's: {last:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted within {LIMIT:?}: tenants {:?}, keys {}/{}, endpoint states {}, parked {}",
            (count(&tenants, "keep"), count(&tenants, "gone")),
            count(&keys, &live_id),
            count(&keys, &revoked_id),
            count(&states, &sick),
            count(&positions, &parked),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        roll_compacted_segments(&k, &prefix).await;
    }
    let secrets = p.config.secrets.clone();
    let received = p.seen.clone();
    tokio::time::timeout(LIMIT, p.stop()).await.expect("the services stop in time");

    let p = k.pipeline_on(&prefix, 1, |c| c.secrets = secrets).await;
    let v = p.get_when("/v1/tenants/keep", |v| v["name"].is_string()).await;
    assert_eq!(v["name"], "Keep 3", "{v}");
    assert_eq!(p.call("GET", "/v1/tenants/gone", None).await.0, 404, "the deleted tenant stays deleted");
    assert_eq!(p.call_as(Some(&live), "GET", "/v1/tenants/keep", None).await.0, 200, "the live key still works");
    assert_eq!(p.call_as(Some(&revoked), "GET", "/v1/tenants/keep", None).await.0, 401, "the revoked key stays revoked");
    let v = p.subscription_when(&sick, |v| v["state"].is_string()).await;
    assert_eq!((v["state"].as_str(), v["consecutive_failures"].as_u64()), (Some("paused"), Some(2)), "{v}");

    // Both resumed: their parked deliveries go out, each once.
    for id in [&sick, &parked] {
        let (status, v) = p.call("POST", &format!("/v1/subscriptions/{id}/resume"), None).await;
        assert_eq!(status, 200, "{v}");
    }
    let seen = received.clone();
    wait_for(&received.changed, LIMIT, "the parked deliveries after the restart", || {
        let got = seen.requests.lock().unwrap();
        got.iter().filter(|r| r.path == "sick").count() >= 3 && got.iter().filter(|r| r.path == "parked").count() >= 3
    })
    .await;
    // Released concurrently: in any order.
    let ids = |path: &str| -> Vec<String> {
        let got = received.requests.lock().unwrap();
        let mut ids: Vec<String> =
            got.iter().filter(|r| r.path == path).map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned()).collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(ids("sick"), ["evt_sick0", "evt_sick1", "evt_sick_held"]);
    assert_eq!(ids("parked"), ["evt_parked0", "evt_parked1", "evt_parked2"]);
    p.stop().await;
}

/// In-flight leases (`in_flight = "count"`) under compaction: finished attempts leave a lease and its tombstone,
/// which the cleaner removes; the lease of an attempt lost with its dispatcher stays, and the partition's next
/// owner, started after the compaction, counts that attempt (`lease_expired`) and retries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_an_attempt_in_flight_when_its_dispatcher_stopped_counts_after_its_lease_was_compacted() {
    let Some((k, _shared)) = shared().await else { return };
    let prefix = ExternalKafka::fresh_prefix();
    k.create_topics(&prefix, 1, &COMPACTING).await;
    let p = k.start_on(&prefix, 1, |c| c.dispatcher.drain_timeout_ms = 200, false).await;
    let topics = Topics::new(prefix.clone());
    let mut lb = hookline_core::policy::builtin("lucibook").unwrap();
    assert_eq!(lb.in_flight, hookline_core::policy::InFlightRule::Count);
    lb.schedule.waits_s = Some(vec![1.0]);
    lb.schedule.max_attempts = Some(2);
    // The lost request hangs past the test: only the next owner concludes its attempt.
    lb.attempt.timeout_ms = hookline_core::policy::MAX_TIMEOUT_MS;
    p.script("leased", vec![Some((204, None)), Some((204, None)), Some((204, None)), None, Some((204, None))]);
    let (id, _) = p.subscribe(json!({"url": p.url("leased"), "event_types": ["*"], "policy_toml": toml::to_string(&lb).unwrap()})).await;

    let dispatcher = |name: &str| {
        let stop = CancellationToken::new();
        let options = hookline_dispatcher::Options { instance: Some(name.into()), ..Default::default() };
        let run = hookline_dispatcher::run(p.config.clone(), stop.clone(), options);
        (stop, tokio::spawn(async move { run.await.expect("dispatcher runs") }))
    };
    let (stop, first) = dispatcher("first-owner");
    for i in 0..3 {
        p.publish(&format!("evt_done{i}"), "thing.happened").await;
        p.wait_final_of(&id, i + 1, LIMIT).await;
    }
    p.publish("evt_lost", "thing.happened").await;
    let seen = p.seen.clone();
    wait_for(&p.seen.changed, LIMIT, "the fourth request, hanging", || seen.requests.lock().unwrap().len() >= 4).await;
    // Stopped with the attempt in flight: the drain gives up on it, its lease stays and its offset uncommitted.
    stop.cancel();
    first.await.unwrap();

    let deadline = Instant::now() + LIMIT;
    loop {
        let leases = values_by_key(&k, topics.inflight()).await;
        let kept: Vec<&Vec<Option<Vec<u8>>>> = leases.iter().filter(|(key, _)| !key.starts_with('\u{0}')).map(|(_, v)| v).collect();
        // The three finished leases gone with their tombstones; the lost one's lease alone.
        if kept.len() == 1 && kept[0].len() == 1 && kept[0][0].is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the in-flight topic was not compacted within {LIMIT:?}: {leases:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        roll_compacted_segments(&k, &prefix).await;
    }

    let (stop, second) = dispatcher("second-owner");
    let finals = p.wait_final_of(&id, 4, LIMIT).await;
    let attempts: Vec<_> = p.attempts.items.lock().unwrap().iter().filter(|a| a.event_id == "evt_lost").cloned().collect();
    let lost = attempts.iter().find(|a| a.outcome == "lease_expired").unwrap_or_else(|| panic!("the lost attempt counts: {attempts:?}"));
    assert_eq!((lost.attempt, lost.verdict.as_str()), (1, "retry"), "{attempts:?}");
    let done = finals.iter().find(|a| a.event_id == "evt_lost" && !a.final_state.is_empty()).expect("evt_lost ended");
    assert_eq!((done.final_state.as_str(), done.attempt), ("succeeded", 2), "{done:?}");
    assert_eq!(p.requests_for("leased", "evt_lost"), 2, "the lost request and its retry");
    stop.cancel();
    second.await.unwrap();
    p.stop().await;
}

/// Three nodes only (replication factor 3, `min.insync.replicas` 2): the leader of a `deliveries` partition is
/// killed with SIGKILL while events flow (200 events, 2 subscriptions), the clients move to the new leaders, and
/// every event the API accepted reaches a final state for both subscriptions. The node is started again at the end,
/// so the cluster is whole for the tests after. Prints one JSON line (`--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_killing_a_partition_leader_under_load_loses_nothing() {
    let Some(k) = ExternalKafka::from_env() else { return };
    let _alone = CLUSTER.write().await;
    if k.replication() < 3 || k.info.get("dir").is_none() {
        eprintln!("skipped: needs a cluster of three nodes from scripts/kafka start --nodes 3 (its JSON line)");
        return;
    }
    let p = k.pipeline(2, |_| {}).await;
    let (a, _) = p.subscribe(json!({"url": p.url("a"), "event_types": ["*"]})).await;
    let (b, _) = p.subscribe(json!({"url": p.url("b"), "event_types": ["*"]})).await;
    let deliveries = Topics::new(p.config.kafka.topic_prefix.clone()).deliveries().to_owned();

    let publish = async {
        let mut accepted = Vec::new();
        for i in 0..200 {
            let id = format!("evt_bl{i}");
            let (status, _) = p.call("POST", "/v1/events", Some(json!({"id": id, "type": "thing.happened", "data": {"n": i}}))).await;
            if status == 202 {
                accepted.push(id);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        accepted
    };
    let kill = async {
        let seen = p.seen.clone();
        wait_for(&p.seen.changed, LIMIT, "deliveries under way", || seen.requests.lock().unwrap().len() >= 60).await;
        let admin = hookline_kafka::client::admin(&k.admin_settings(), "integration-leader").unwrap();
        let md = tokio::task::block_in_place(|| admin.inner().fetch_metadata(Some(&deliveries), Duration::from_secs(10))).unwrap();
        let leader = md.topics()[0].partitions()[0].leader();
        // DIR/pids has the node's current pid (line N), also after `scripts/kafka restart-node`.
        let pids = std::fs::read_to_string(PathBuf::from(k.info["dir"].as_str().expect("the cluster's dir")).join("pids")).unwrap();
        let pid = pids.lines().nth(leader as usize - 1).expect("the leader's pid").trim().to_owned();
        let status = std::process::Command::new("kill").args(["-9", &pid]).status().unwrap();
        assert!(status.success(), "kill -9 {pid}");
        (leader, Instant::now())
    };
    let (accepted, (leader, killed_at)) = futures::future::join(publish, kill).await;

    let want: HashSet<(String, String)> = accepted.iter().flat_map(|e| [(a.clone(), e.clone()), (b.clone(), e.clone())]).collect();
    let attempts = p.attempts.clone();
    let finals = || -> HashSet<(String, String)> {
        attempts
            .items
            .lock()
            .unwrap()
            .iter()
            .filter(|r| !r.final_state.is_empty())
            .map(|r| (r.subscription_id.clone(), r.event_id.clone()))
            .collect()
    };
    wait_for(&p.attempts.changed, Duration::from_secs(120), "a final state for every accepted delivery", || want.is_subset(&finals()))
        .await;
    let recovered_s = killed_at.elapsed().as_secs_f64();
    let requests = p.seen.requests.lock().unwrap().len();
    println!(
        "{}",
        json!({"fault": "partition leader killed (SIGKILL)", "node": leader, "accepted": accepted.len(),
               "final_states": want.len(), "missing": want.difference(&finals()).count(),
               "duplicates": requests - want.len(), "all_final_after_kill_s": recovered_s})
    );
    assert!(accepted.len() >= 150, "only {} of 200 events accepted", accepted.len());
    tokio::time::timeout(Duration::from_secs(90), p.stop()).await.expect("the services stop in time");

    // The cluster whole again for the tests after this one.
    let dir = k.info["dir"].as_str().expect("the cluster's dir");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka");
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(script).args(["restart-node", "--dir", dir, "--node", &leader.to_string()]).output()
    })
    .unwrap();
    assert!(out.status.success(), "restarting node {leader}: {}", String::from_utf8_lossy(&out.stderr));
}

/// KIP-848's consumer group protocol (`kafka.group_protocol = "consumer"`): the broker assigns the partitions. The
/// fan-out, a retry through the scheduler's group, and a restart of every service (members leaving and new ones
/// joining) deliver everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_pipeline_works_with_the_consumer_group_protocol() {
    let Some((k, _shared)) = shared().await else { return };
    let kip848 = |c: &mut hookline_service::Config| c.kafka.group_protocol = hookline_kafka::settings::GroupProtocol::Consumer;
    let prefix = ExternalKafka::fresh_prefix();
    k.create_topics(&prefix, 2, &[]).await;
    let p = k.pipeline_on(&prefix, 2, kip848).await;
    pipeline::fans_out_by_filter_and_signs_every_request_on(&p).await;
    let toml = quick_policy(&[1.0], |_| {});
    p.script("retried", vec![Some((503, None)), Some((200, None))]);
    let (retried, _) = p.subscribe(json!({"url": p.url("retried"), "event_types": ["x.*"], "policy_toml": toml})).await;
    p.publish("evt_k1", "x.y").await;
    let secrets = p.config.secrets.clone();
    let received = p.seen.clone();
    tokio::time::timeout(LIMIT, p.stop()).await.expect("the services stop in time");

    let p = k
        .pipeline_on(&prefix, 2, |c| {
            kip848(c);
            c.secrets = secrets;
        })
        .await;
    p.publish("evt_k2", "x.y").await;
    let attempts = p.attempts.clone();
    let done = |e: &str| {
        attempts.items.lock().unwrap().iter().any(|a| a.subscription_id == retried && a.event_id == e && a.final_state == "succeeded")
    };
    wait_for(&p.attempts.changed, LIMIT, "both events delivered after the restart", || done("evt_k1") && done("evt_k2")).await;
    let ids: HashSet<String> = received
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path == "retried")
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok()?["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids, HashSet::from(["evt_k1".to_owned(), "evt_k2".to_owned()]));
    p.stop().await;
}

/// Creates (or updates) SCRAM user `user` with `password` and grants it `needs` (literal ACLs), through Confluent's
/// admin client on the PLAINTEXT listener (a super user there). Returns the password's file.
async fn grant(k: &ExternalKafka, py: &str, user: &str, password: &str, needs: &[hookline_kafka::acl_check::Need]) -> PathBuf {
    use hookline_kafka::acl_check::{Operation, Resource};
    let acls: Vec<serde_json::Value> = needs
        .iter()
        .map(|n| {
            let (kind, name) = match &n.resource {
                Resource::Topic(t) => ("topic", t),
                Resource::Group(g) => ("group", g),
            };
            let op = match n.operation {
                Operation::Read => "read",
                Operation::Write => "write",
                Operation::Describe => "describe",
            };
            json!([kind, name, op])
        })
        .collect();
    crate::support::run_python(py, "kafka_admin.py", &["grant", &k.bootstrap, user, password, &serde_json::Value::from(acls).to_string()])
        .await;
    let file = crate::support::temp_dir("scram").join(format!("{user}.password"));
    std::fs::write(&file, password).unwrap();
    file
}

/// Each service as its own SCRAM user holding only what docs/operations.md ("ACLs") lists for it: one ACL less and
/// it stops at start naming that one; with it, it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_service_without_one_of_its_acls_stops_at_start_naming_it() {
    use hookline_kafka::acl_check::{self, Need, Operation};
    let Some((k, _shared)) = shared().await else { return };
    let Some(info) = secured(&k) else { return };
    let Some(py) = crate::support::python() else { return };
    let c = base_config(&k);
    k.create_topics(&c.kafka.topic_prefix, 1, &[]).await;
    let topics = Topics::new(c.kafka.topic_prefix.clone());

    type Start = fn(
        hookline_service::Config,
        CancellationToken,
        hookline_service::Readiness,
    ) -> futures::future::BoxFuture<'static, Result<(), String>>;
    let services: [(&str, Vec<Need>, Need, Start); 3] = [
        (
            "ingest",
            acl_check::ingest_needs(&topics, &c.ingest.group_id, None, Some(&c.log.group_id)),
            Need::topic(topics.deliveries(), Operation::Write),
            |c, stop, readiness| {
                Box::pin(async move {
                    let o = hookline_ingest::Options { readiness, ..Default::default() };
                    hookline_ingest::run(c, stop, o).await.map_err(|e| e.to_string())
                })
            },
        ),
        (
            "dispatcher",
            acl_check::dispatcher_needs(&topics, &c.dispatcher.group_id),
            Need::topic(topics.attempts(), Operation::Write),
            |c, stop, readiness| {
                Box::pin(async move {
                    let o = hookline_dispatcher::Options { readiness, ..Default::default() };
                    hookline_dispatcher::run(c, stop, o).await.map_err(|e| e.to_string())
                })
            },
        ),
        (
            "retry-scheduler",
            acl_check::retry_scheduler_needs(&topics, &c.retry_scheduler.group_id),
            Need::group(c.retry_scheduler.group_id.clone(), Operation::Read),
            |c, stop, readiness| {
                Box::pin(async move {
                    let o = hookline_retry_scheduler::Options { readiness, ..Default::default() };
                    hookline_retry_scheduler::run(c, stop, o).await.map_err(|e| e.to_string())
                })
            },
        ),
    ];
    for (name, needs, lacking, start) in services {
        assert!(needs.contains(&lacking), "{name}: {lacking} is one of its needs");
        let user = format!("{name}-{}", rand::random::<u32>());
        let all_but_one: Vec<Need> = needs.iter().filter(|n| **n != lacking).cloned().collect();
        let secret = format!("pw-{}", rand::random::<u64>());
        let password = grant(&k, &py, &user, &secret, &all_but_one).await;
        let mut own = c.clone();
        use_scram(&mut own, info, &user, password);

        let stop = CancellationToken::new();
        let e = tokio::time::timeout(LIMIT, start(own.clone(), stop.clone(), Default::default()))
            .await
            .unwrap_or_else(|_| panic!("{name} neither started nor stopped"))
            .expect_err("a service without one of its ACLs does not start");
        assert!(e.contains(&lacking.to_string()), "{name}: {e}");
        assert_eq!(e.matches(" on topic ").count() + e.matches(" on group ").count(), 1, "{name}: only {lacking} lacks: {e}");

        // Granted that one too, it starts: ready once its group has its partitions.
        grant(&k, &py, &user, &secret, std::slice::from_ref(&lacking)).await;
        let readiness = hookline_service::Readiness::default();
        let running = tokio::spawn(start(own, stop.clone(), readiness.clone()));
        let deadline = Instant::now() + LIMIT;
        while !readiness.is_ready() {
            assert!(!running.is_finished(), "{name} stopped: {:?}", running.await);
            assert!(Instant::now() < deadline, "{name} was not ready within {LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        running.await.unwrap().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The partition's (earliest, end) offsets.
async fn watermarks(settings: &hookline_kafka::KafkaSettings, topic: &str, partition: i32) -> (i64, i64) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let config = hookline_kafka::client::table_consumer_config(settings, "watermarks").unwrap();
    let consumer: BaseConsumer = config.create().unwrap();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10)).unwrap()).await.unwrap()
}

/// Retention for real: a paused subscription's deliveries parked on `held`, the records deleted under them (what
/// `retention.ms` does to a pause longer than it; here DeleteRecords, at once). On resume the loss is counted and
/// logged, the release does not wait for records that are gone, and the subscription's next event is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_parked_deliveries_deleted_by_retention_are_counted_and_the_subscription_goes_on() {
    let Some((k, _shared)) = shared().await else { return };
    let Some(py) = crate::support::python() else { return };
    let p = k.pipeline(1, |_| {}).await;
    let topics = Topics::new(p.config.kafka.topic_prefix.clone());
    let id = crate::parking::paused(&p, "held", "order.held").await;
    for i in 0..3 {
        p.publish(&format!("evt_lost{i}"), "order.held").await;
    }
    // The three are on `held` and the retry-scheduler parked them (its position is on `parked`).
    let deadline = Instant::now() + LIMIT;
    loop {
        let mut parked = false;
        hookline_kafka::scan::scan(&p.config.kafka, topics.parked(), None, LIMIT, |m| {
            use rdkafka::Message as _;
            parked |= m.key() == Some(id.as_bytes()) && m.payload().is_some_and(|v| !v.is_empty());
        })
        .await
        .unwrap();
        if parked && watermarks(&p.config.kafka, topics.held(), 0).await.1 >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the held deliveries were not parked within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, end) = watermarks(&p.config.kafka, topics.held(), 0).await;
    let out =
        crate::support::run_python(&py, "kafka_admin.py", &["delete-records", &k.bootstrap, topics.held(), "0", &end.to_string()]).await;
    assert_eq!(out.trim(), format!("earliest {end}"));

    let lost = "hookline_parked_records_lost_total{topic=\"held\"}";
    let before = p.counter(lost).await;
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{id}/resume"), None).await;
    assert_eq!(status, 200, "{v}");
    let deadline = Instant::now() + LIMIT;
    while p.counter(lost).await < before + 3.0 {
        assert!(Instant::now() < deadline, "the deleted parked records were not counted within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Not stuck on what is gone: the next event is delivered, and only it.
    p.publish("evt_after", "order.held").await;
    p.wait_final_of(&id, 1, LIMIT).await;
    let ids: Vec<String> = p.requests_to("held").iter().map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    p.stop().await;
}
