//! The `[kafka]` table of the config file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// `host:port,host:port`.
    pub bootstrap_servers: String,
    /// Prepended to every topic name.
    pub topic_prefix: String,
    /// Partitions of the work and state topics (deliveries, retry tiers, held, endpoint-state, subscriptions,
    /// attempts). They must all be equal: that is what co-partitions them by subscription id.
    pub partitions: i32,
    /// Partitions of the `events` input topic.
    pub event_partitions: i32,
    pub replication_factor: i32,
    /// How clients talk to the brokers: `plaintext`, `ssl` (TLS), `sasl_plaintext` or `sasl_ssl` (SASL over TLS).
    pub security_protocol: SecurityProtocol,
    /// TLS to the brokers (`ssl`, `sasl_ssl`): CA bundle, client certificate for mTLS, hostname check.
    pub tls: TlsSettings,
    /// SASL authentication (`sasl_plaintext`, `sasl_ssl`).
    pub sasl: SaslSettings,
    /// OAUTHBEARER tokens from an OIDC provider (client credentials), with `sasl.mechanism = "oauthbearer"`.
    pub oauth: OAuthSettings,
    /// Amazon MSK IAM authentication, with `sasl.mechanism = "aws_msk_iam"`.
    pub aws: AwsSettings,
    /// Passed to librdkafka as is (tuning): `"socket.keepalive.enable" = "true"`. hookline's own safety settings
    /// (acks, idempotence, partitioner, offset storing) and what the keys above set cannot be given here.
    pub properties: BTreeMap<String, String>,
    /// How long a producer keeps retrying a record before reporting failure.
    pub delivery_timeout_ms: u64,
    /// Producer batching delay (`linger.ms`) of the hops no delivery waits on: the dispatcher's attempt records,
    /// retry tiers and state, the retry-scheduler's. 5 ms, librdkafka's own default and Kafka 4.0's: fewer, larger
    /// produce requests cost the broker and the clients less CPU per record (docs/benchmarks.md, "Dispatcher CPU
    /// per delivery").
    pub linger_ms: u64,
    /// `linger.ms` of ingest's producer, the hops every delivery waits on: the event the API accepts and the
    /// delivery tasks the fan-out writes. 0: on Apache Kafka each millisecond here is a millisecond of publish →
    /// receiver latency, twice (docs/benchmarks.md, "On Apache Kafka"); under load librdkafka still batches what
    /// arrives while a request is in flight.
    pub delivery_path_linger_ms: u64,
    /// Largest record a producer sends (`message.max.bytes`); keep it at or below the brokers' and topics' limit.
    pub message_max_bytes: usize,
    /// Longest a consumer's fetch waits at the broker for data. Real Kafka answers as soon as data arrives, so this
    /// only bounds idle polling; the embedded mock broker always waits it out when a partition is empty, so there it
    /// is added to every hop's latency (dev mode uses 10 ms).
    pub fetch_wait_max_ms: u64,
    /// Whether the broker answers offset-by-time lookups (real Kafka does). Replays "since a time" use it to
    /// start near the time; without it (the embedded mock broker) they scan from the beginning.
    pub offsets_by_time: bool,
    /// Whether each service asks the broker, at start, for its principal's permissions on the topics and groups it
    /// uses, and stops naming what is lacking (docs/operations.md, "ACLs"). The embedded mock broker cannot answer
    /// (dev mode turns it off).
    pub check_acls_at_start: bool,
    /// Group consumers' `session.timeout.ms`: how long a member that stopped heartbeating (killed, frozen, cut
    /// off) keeps its partitions before the group reassigns them. Shorter recovers sooner from a crash; too short
    /// turns a GC-free but briefly stalled host into a rebalance. Heartbeats go every tenth of it.
    pub session_timeout_ms: u64,
    /// Group consumers' `max.poll.interval.ms`: the longest a service's consume loop may go without polling before
    /// librdkafka takes the member out of its group (its partitions go to the others, its later commits fail and
    /// the next owner redoes what it had not committed). It bounds how long a stuck loop holds partitions. At
    /// least `session_timeout_ms` (librdkafka requires it) and above `dispatcher.revoke_drain_ms` (a revoke drain
    /// runs inside a poll).
    pub max_poll_interval_ms: u64,
    /// Static group membership (`group.instance.id`, KIP-345): a stable name per process, e.g. the pod name. A
    /// member that restarts under the same name within `session_timeout_ms` gets its partitions back without a
    /// rebalance; a static member that stops does not leave its groups, so its partitions wait up to
    /// `session_timeout_ms` before moving. Unset: dynamic membership (a stopping member leaves at once). Must be
    /// unique per process: a second process with the same name fences the first out of the group.
    pub group_instance_id: Option<String>,
    /// The consumer group protocol: `classic` (the group coordinator runs the rebalance, the members assign
    /// partitions cooperative-sticky) or `consumer` (KIP-848, Kafka 4.0 and later: the broker assigns, each member
    /// moves only its own partitions, no group-wide barrier). With `consumer` the session timeout and heartbeat
    /// interval are the broker's (`group.consumer.session.timeout.ms`, `group.consumer.heartbeat.interval.ms`):
    /// `session_timeout_ms` is not sent.
    pub group_protocol: GroupProtocol,
}

/// `group.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupProtocol {
    #[default]
    Classic,
    Consumer,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            bootstrap_servers: "localhost:9092".into(),
            topic_prefix: "hookline.".into(),
            partitions: 12,
            event_partitions: 12,
            replication_factor: 3,
            security_protocol: SecurityProtocol::default(),
            tls: TlsSettings::default(),
            sasl: SaslSettings::default(),
            oauth: OAuthSettings::default(),
            aws: AwsSettings::default(),
            properties: BTreeMap::new(),
            delivery_timeout_ms: 120_000,
            linger_ms: 5,
            delivery_path_linger_ms: 0,
            offsets_by_time: true,
            check_acls_at_start: true,
            fetch_wait_max_ms: 100,
            message_max_bytes: 1_000_000,
            session_timeout_ms: 10_000,
            max_poll_interval_ms: 300_000,
            group_instance_id: None,
            group_protocol: GroupProtocol::default(),
        }
    }
}

/// Properties hookline sets itself; overriding them would break a delivery guarantee.
pub const PROTECTED_PROPERTIES: &[&str] = &[
    "acks",
    "enable.idempotence",
    "partitioner",
    "enable.auto.offset.store",
    "group.id",
    "bootstrap.servers",
    "fetch.wait.max.ms",
    "message.max.bytes",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "group.instance.id",
    "partition.assignment.strategy",
    "group.protocol",
];

/// `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    pub fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// `sasl.mechanism`. GSSAPI (Kerberos) is not built in.
///
/// `aws_msk_iam` is Amazon MSK's IAM authentication: SASL/OAUTHBEARER with a SigV4-signed token (`crate::aws`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "plain")]
    Plain,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "scram-sha-512")]
    ScramSha512,
    #[serde(rename = "oauthbearer")]
    OAuthBearer,
    #[serde(rename = "aws_msk_iam", alias = "aws-msk-iam")]
    AwsMskIam,
}

impl SaslMechanism {
    /// librdkafka's name.
    pub fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::OAuthBearer | Self::AwsMskIam => "OAUTHBEARER",
        }
    }

    /// hookline's name, as in the config.
    pub fn as_config(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::ScramSha256 => "scram-sha-256",
            Self::ScramSha512 => "scram-sha-512",
            Self::OAuthBearer => "oauthbearer",
            Self::AwsMskIam => "aws_msk_iam",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// PEM bundle of the CAs that sign the brokers' certificates. Unset: the system's CA store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for mTLS; needs `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// A file holding the password of an encrypted `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_password_file: Option<PathBuf>,
    /// Whether the broker's certificate must name the host the client connects to. Turn off only for a broker
    /// whose certificate cannot be fixed: anyone with a certificate from the same CA could then pose as it.
    pub check_hostname: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self { ca_file: None, cert_file: None, key_file: None, key_password_file: None, check_hostname: true }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SaslSettings {
    /// `plain`, `scram-sha-256`, `scram-sha-512`, `oauthbearer` or `aws_msk_iam`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<SaslMechanism>,
    /// For `plain` and `scram-*`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// A file holding the password (a trailing newline is ignored). Read whenever a client is created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// The name of an environment variable holding the password (not the password).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// A file holding a JAAS line with the username and password, as a Strimzi KafkaUser's Secret has under
    /// `sasl.jaas.config`: `org.apache.kafka.common.security.scram.ScramLoginModule required username="u"
    /// password="p";` (or `PlainLoginModule`). Instead of `username` and a password. Read whenever a client is created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jaas_config_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AwsSettings {
    /// The MSK cluster's region, e.g. `eu-west-1`: the token is signed for `kafka.REGION.amazonaws.com`.
    /// Credentials come from the standard AWS chain (environment, web identity, container endpoint, instance
    /// metadata), not from here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthSettings {
    /// The OIDC provider's token endpoint: `https://idp.example.com/oauth2/token` (http only to a loopback
    /// address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// A file holding the client secret. Read at every token fetch, so a rotated secret is picked up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret_file: Option<PathBuf>,
    /// Space-separated scopes to ask for; unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// Properties that the `kafka.security_protocol`, `kafka.tls.*`, `kafka.sasl.*` and `kafka.oauth.*` keys set, and
/// properties that would put a secret inline in the config: refused in `kafka.properties`, with the key to use.
const SECURITY_PROPERTIES: &[(&str, &str)] = &[
    ("security.protocol", "kafka.security_protocol"),
    ("ssl.ca.location", "kafka.tls.ca_file"),
    ("ssl.ca.pem", "kafka.tls.ca_file"),
    ("ssl.certificate.location", "kafka.tls.cert_file"),
    ("ssl.certificate.pem", "kafka.tls.cert_file"),
    ("ssl.key.location", "kafka.tls.key_file"),
    ("ssl.key.pem", "kafka.tls.key_file"),
    ("ssl.key.password", "kafka.tls.key_password_file"),
    ("ssl.keystore.location", "kafka.tls.cert_file and kafka.tls.key_file (PEM)"),
    ("ssl.keystore.password", "kafka.tls.cert_file and kafka.tls.key_file (PEM)"),
    ("ssl.endpoint.identification.algorithm", "kafka.tls.check_hostname"),
    ("sasl.mechanism", "kafka.sasl.mechanism"),
    ("sasl.mechanisms", "kafka.sasl.mechanism"),
    ("sasl.username", "kafka.sasl.username"),
    ("sasl.password", "kafka.sasl.password_file or kafka.sasl.password_env"),
    ("sasl.oauthbearer.config", "kafka.oauth.*"),
    ("sasl.oauthbearer.method", "kafka.oauth.*"),
    ("sasl.oauthbearer.client.id", "kafka.oauth.client_id"),
    ("sasl.oauthbearer.client.secret", "kafka.oauth.client_secret_file"),
    ("sasl.oauthbearer.token.endpoint.url", "kafka.oauth.token_endpoint"),
    ("sasl.oauthbearer.scope", "kafka.oauth.scope"),
    ("enable.sasl.oauthbearer.unsecure.jwt", "kafka.oauth.*"),
    ("sasl.jaas.config", "kafka.sasl.jaas_config_file"),
];

/// A file named by a key must be readable when the service starts, not at the first reconnect.
fn readable(key: &str, path: &Path) -> Result<(), String> {
    std::fs::File::open(path).map(drop).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))
}

/// Username and password from a JAAS line (`sasl.jaas.config`): `<LoginModule class> <flag> key="value" … ;`.
/// Values are double-quoted (with `\"` and `\\` escapes) or bare words, as Kafka's own parser takes them.
pub fn parse_jaas_config(text: &str) -> Result<(String, Secret), String> {
    let text = text.trim();
    let body = text.strip_suffix(';').ok_or("the line must end with ';'")?.trim_end();
    let (module, rest) = body.split_once(char::is_whitespace).ok_or("no login module and flag")?;
    if !matches!(
        module,
        "org.apache.kafka.common.security.scram.ScramLoginModule" | "org.apache.kafka.common.security.plain.PlainLoginModule"
    ) {
        return Err(format!("the login module {module:?} is neither ScramLoginModule nor PlainLoginModule"));
    }
    let rest = rest.trim_start();
    let (flag, mut rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    if !matches!(flag, "required" | "requisite" | "sufficient" | "optional") {
        return Err(format!("expected a flag (required) after the login module, got {flag:?}"));
    }
    let (mut username, mut password) = (None, None);
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        // The text is not quoted in the message: it may hold the password.
        let (key, after) = rest.split_once('=').ok_or("expected key=\"value\" options after the flag")?;
        let key = key.trim();
        let after = after.trim_start();
        let value;
        if let Some(quoted) = after.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => out.push(chars.next().map(|(_, c)| c).ok_or("an unterminated quoted value")?),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => out.push(c),
                }
            }
            let end = end.ok_or("an unterminated quoted value")?;
            value = out;
            rest = &quoted[end..];
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            value = after[..end].to_owned();
            rest = &after[end..];
        }
        match key {
            "username" => username = Some(value),
            "password" => password = Some(value),
            _ => {}
        }
    }
    match (username.filter(|u| !u.is_empty()), password.filter(|p| !p.is_empty())) {
        (Some(u), Some(p)) => Ok((u, Secret(p))),
        (None, _) => Err("no username=\"…\" in it".into()),
        (_, None) => Err("no password=\"…\" in it".into()),
    }
}

impl KafkaSettings {
    /// The SASL username and password (PLAIN, SCRAM): from `kafka.sasl.jaas_config_file`, or `kafka.sasl.username`
    /// with `kafka.sasl.password_file` or `kafka.sasl.password_env`.
    pub fn sasl_credentials(&self) -> Result<Option<(String, Secret)>, String> {
        const KEY: &str = "kafka.sasl.jaas_config_file";
        if let Some(path) = &self.sasl.jaas_config_file {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{KEY}: cannot read {}: {e}", path.display()))?;
            return parse_jaas_config(&text).map(Some).map_err(|e| format!("{KEY}: {}: {e}", path.display()));
        }
        match (&self.sasl.username, self.sasl_password()?) {
            (Some(u), Some(p)) => Ok(Some((u.clone(), p))),
            _ => Ok(None),
        }
    }

    /// The SASL password, from `kafka.sasl.password_file` or the variable `kafka.sasl.password_env` names.
    pub fn sasl_password(&self) -> Result<Option<Secret>, String> {
        if let Some(path) = &self.sasl.password_file {
            return read_secret("kafka.sasl.password_file", path).map(Some);
        }
        if let Some(var) = &self.sasl.password_env {
            return match std::env::var(var) {
                Ok(v) if !v.is_empty() => Ok(Some(Secret(v))),
                Ok(_) => Err(format!("kafka.sasl.password_env: the variable {var} is empty")),
                Err(_) => Err(format!("kafka.sasl.password_env: the variable {var} is not set")),
            };
        }
        Ok(None)
    }

    /// The password of the TLS key, from `kafka.tls.key_password_file`.
    pub fn tls_key_password(&self) -> Result<Option<Secret>, String> {
        self.tls.key_password_file.as_deref().map(|p| read_secret("kafka.tls.key_password_file", p)).transpose()
    }

    fn validate_security(&self) -> Result<(), String> {
        let proto = self.security_protocol;
        let tls = &self.tls;
        let tls_keys = [
            ("kafka.tls.ca_file", tls.ca_file.as_deref()),
            ("kafka.tls.cert_file", tls.cert_file.as_deref()),
            ("kafka.tls.key_file", tls.key_file.as_deref()),
            ("kafka.tls.key_password_file", tls.key_password_file.as_deref()),
        ];
        for (key, path) in tls_keys {
            let Some(path) = path else { continue };
            if !proto.tls() {
                return Err(format!(
                    "{key}: set, but kafka.security_protocol = \"{}\" does not use TLS (use \"ssl\" or \"sasl_ssl\")",
                    proto.as_str()
                ));
            }
            readable(key, path)?;
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => {
                return Err("kafka.tls.key_file: required with kafka.tls.cert_file (mTLS needs the certificate's key)".into())
            }
            (None, Some(_)) => return Err("kafka.tls.cert_file: required with kafka.tls.key_file".into()),
            _ => {}
        }
        if tls.key_password_file.is_some() && tls.key_file.is_none() {
            return Err("kafka.tls.key_password_file: set without kafka.tls.key_file".into());
        }
        self.tls_key_password()?;

        let sasl = &self.sasl;
        let oauth = &self.oauth;
        let password_given =
            sasl.username.is_some() || sasl.password_file.is_some() || sasl.password_env.is_some() || sasl.jaas_config_file.is_some();
        if sasl.mechanism != Some(SaslMechanism::AwsMskIam) && self.aws != AwsSettings::default() {
            return Err("kafka.aws: set, but kafka.sasl.mechanism is not \"aws_msk_iam\"".into());
        }
        let Some(mechanism) = sasl.mechanism else {
            if proto.sasl() {
                return Err(format!(
                    "kafka.sasl.mechanism: required with kafka.security_protocol = \"{}\" (plain, scram-sha-256, scram-sha-512, oauthbearer or aws_msk_iam)",
                    proto.as_str()
                ));
            }
            if password_given {
                return Err("kafka.sasl.mechanism: kafka.sasl.username or a password is set, but no mechanism".into());
            }
            if *oauth != OAuthSettings::default() {
                return Err("kafka.oauth: set, but kafka.sasl.mechanism is not \"oauthbearer\"".into());
            }
            return Ok(());
        };
        if !proto.sasl() {
            return Err(format!(
                "kafka.sasl.mechanism: set, but kafka.security_protocol = \"{}\" does not use SASL (use \"sasl_ssl\" or \"sasl_plaintext\")",
                proto.as_str()
            ));
        }
        if mechanism == SaslMechanism::OAuthBearer {
            if password_given {
                return Err("kafka.sasl.username: not used with kafka.sasl.mechanism = \"oauthbearer\" (tokens come from kafka.oauth.*); remove the username and password".into());
            }
            return crate::oauth::OAuthClient::from_settings(self).and_then(|c| c.check_secret());
        }
        if *oauth != OAuthSettings::default() {
            return Err("kafka.oauth: set, but kafka.sasl.mechanism is not \"oauthbearer\"".into());
        }
        if mechanism == SaslMechanism::AwsMskIam {
            if proto != SecurityProtocol::SaslSsl {
                // MSK serves IAM on its TLS listener only (port 9098, or 9198 from outside the VPC).
                return Err(format!(
                    "kafka.security_protocol: \"{}\" with kafka.sasl.mechanism = \"aws_msk_iam\"; use \"sasl_ssl\"",
                    proto.as_str()
                ));
            }
            if password_given {
                return Err("kafka.sasl.username: not used with kafka.sasl.mechanism = \"aws_msk_iam\" (credentials come from the AWS chain); remove the username and password".into());
            }
            return crate::aws::MskIamClient::from_settings(self).map(drop);
        }
        if let Some(path) = &sasl.jaas_config_file {
            for (key, set) in [
                ("kafka.sasl.username", sasl.username.is_some()),
                ("kafka.sasl.password_file", sasl.password_file.is_some()),
                ("kafka.sasl.password_env", sasl.password_env.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "kafka.sasl.jaas_config_file: set together with {key}; the JAAS line has the username and password, keep one or the other"
                    ));
                }
            }
            readable("kafka.sasl.jaas_config_file", path)?;
            return self.sasl_credentials().map(drop);
        }
        if sasl.username.as_deref().is_none_or(|u| u.trim().is_empty()) {
            return Err(format!(
                "kafka.sasl.username: required (or kafka.sasl.jaas_config_file) with kafka.sasl.mechanism = \"{}\"",
                mechanism.as_librdkafka().to_ascii_lowercase()
            ));
        }
        match (&sasl.password_file, &sasl.password_env) {
            (Some(_), Some(_)) => return Err("kafka.sasl.password_file: set together with kafka.sasl.password_env; keep one".into()),
            (None, None) => {
                return Err(format!(
                    "kafka.sasl.password_file: required (or kafka.sasl.password_env) with kafka.sasl.mechanism = \"{}\"",
                    mechanism.as_librdkafka().to_ascii_lowercase()
                ))
            }
            _ => {}
        }
        self.sasl_password().map(drop)
    }
}

/// A secret read from a file or the environment. Its Debug and Display never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Reads a one-line secret file; the trailing newline editors and `echo` add is not part of it.
pub(crate) fn read_secret(key: &str, path: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    let value = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    if value.is_empty() {
        return Err(format!("{key}: {} is empty", path.display()));
    }
    Ok(Secret(value.to_owned()))
}

/// Property values whose key looks secret are shown as `[redacted]`: a config dump in a log never carries one.
impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(k, v)| {
                let secret = ["password", "secret", "pem", "jaas", "token"].iter().any(|w| k.contains(w));
                (k.as_str(), if secret { "[redacted]" } else { v.as_str() })
            })
            .collect();
        f.debug_struct("KafkaSettings")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic_prefix", &self.topic_prefix)
            .field("partitions", &self.partitions)
            .field("event_partitions", &self.event_partitions)
            .field("replication_factor", &self.replication_factor)
            .field("security_protocol", &self.security_protocol)
            .field("tls", &self.tls)
            .field("sasl", &self.sasl)
            .field("oauth", &self.oauth)
            .field("aws", &self.aws)
            .field("properties", &properties)
            .field("delivery_timeout_ms", &self.delivery_timeout_ms)
            .field("linger_ms", &self.linger_ms)
            .field("delivery_path_linger_ms", &self.delivery_path_linger_ms)
            .field("message_max_bytes", &self.message_max_bytes)
            .field("fetch_wait_max_ms", &self.fetch_wait_max_ms)
            .field("offsets_by_time", &self.offsets_by_time)
            .field("check_acls_at_start", &self.check_acls_at_start)
            .field("session_timeout_ms", &self.session_timeout_ms)
            .field("max_poll_interval_ms", &self.max_poll_interval_ms)
            .field("group_instance_id", &self.group_instance_id)
            .field("group_protocol", &self.group_protocol)
            .finish()
    }
}

impl KafkaSettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err("kafka.bootstrap_servers: must not be empty".into());
        }
        if self.partitions < 1 {
            return Err(format!("kafka.partitions: must be at least 1, got {}", self.partitions));
        }
        if self.event_partitions < 1 {
            return Err(format!("kafka.event_partitions: must be at least 1, got {}", self.event_partitions));
        }
        if self.fetch_wait_max_ms == 0 || self.fetch_wait_max_ms > 10_000 {
            return Err(format!("kafka.fetch_wait_max_ms: must be between 1 and 10000, got {}", self.fetch_wait_max_ms));
        }
        // Kafka brokers accept 6 s to 30 min by default (group.min/max.session.timeout.ms).
        if !(1_000..=1_800_000).contains(&self.session_timeout_ms) {
            return Err(format!("kafka.session_timeout_ms: must be between 1000 and 1800000, got {}", self.session_timeout_ms));
        }
        // librdkafka refuses a poll interval below the session timeout; its ceiling is a day.
        if self.max_poll_interval_ms < self.session_timeout_ms || self.max_poll_interval_ms > 86_400_000 {
            return Err(format!(
                "kafka.max_poll_interval_ms: must be between kafka.session_timeout_ms ({}) and 86400000, got {}",
                self.session_timeout_ms, self.max_poll_interval_ms
            ));
        }
        if let Some(id) = &self.group_instance_id {
            // Kafka's rule for group instance ids (the one for topic names): 1 to 249 of [A-Za-z0-9._-].
            let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            if id.is_empty() || id.len() > 249 || !id.chars().all(legal) {
                return Err(format!("kafka.group_instance_id: must be 1 to 249 characters of A-Z, a-z, 0-9, '.', '_' and '-', got {id:?}"));
            }
        }
        if self.replication_factor < 1 {
            return Err(format!("kafka.replication_factor: must be at least 1, got {}", self.replication_factor));
        }
        if let Some(k) = self.properties.keys().find(|k| PROTECTED_PROPERTIES.contains(&k.as_str())) {
            let instead = match k.as_str() {
                "fetch.wait.max.ms" => " (use kafka.fetch_wait_max_ms)",
                "message.max.bytes" => " (use kafka.message_max_bytes)",
                "session.timeout.ms" | "heartbeat.interval.ms" => " (use kafka.session_timeout_ms)",
                "max.poll.interval.ms" => " (use kafka.max_poll_interval_ms)",
                "group.instance.id" => " (use kafka.group_instance_id)",
                "group.protocol" => " (use kafka.group_protocol)",
                "partition.assignment.strategy" => " (hookline's loops handle cooperative-sticky's incremental rebalances)",
                _ => "",
            };
            return Err(format!(
                "kafka.properties.{k}: hookline sets this itself (at-least-once delivery depends on it); remove it{instead}"
            ));
        }
        if let Some(codec) = self.properties.get("compression.type") {
            // librdkafka's own message would only come at the first producer's creation, without the key's path.
            const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
            if !CODECS.contains(&codec.as_str()) {
                return Err(format!("kafka.properties.compression.type: one of {}, got {codec:?}", CODECS.join(", ")));
            }
        }
        if let Some((k, instead)) = self.properties.keys().find_map(|k| SECURITY_PROPERTIES.iter().find(|(p, _)| p == k)) {
            return Err(format!(
                "kafka.properties.{k}: not accepted here; use {instead} (TLS and SASL have their own keys, and secrets \
                 come from files or the environment, never inline)"
            ));
        }
        self.validate_security()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::group_consumer_config;

    /// A file with `contents` in a directory of its own.
    fn file(name: &str, contents: &str) -> PathBuf {
        // A directory per call: tests run in parallel and would otherwise rewrite each other's files mid-read.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("hookline-kafka-settings-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn parse(text: &str) -> KafkaSettings {
        toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn invalid(s: &KafkaSettings) -> String {
        s.validate().expect_err("must be refused")
    }

    fn scram() -> KafkaSettings {
        let mut s = KafkaSettings { security_protocol: SecurityProtocol::SaslSsl, ..Default::default() };
        s.sasl.mechanism = Some(SaslMechanism::ScramSha512);
        s.sasl.username = Some("svc-hookline".into());
        s.sasl.password_file = Some(file("scram-password", "s3cret-pw\n"));
        s
    }

    #[test]
    fn the_default_is_plaintext_and_valid() {
        let s = KafkaSettings::default();
        assert_eq!(s.security_protocol, SecurityProtocol::Plaintext);
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("security.protocol"), Some("plaintext"));
        assert_eq!(c.get("sasl.mechanism"), None);
    }

    #[test]
    fn group_consumers_rebalance_incrementally_with_a_bounded_poll_interval() {
        let mut s = KafkaSettings::default();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("partition.assignment.strategy"), Some("cooperative-sticky"));
        assert_eq!(c.get("max.poll.interval.ms"), Some("300000"));
        assert_eq!(c.get("group.instance.id"), None, "dynamic membership unless a name is given");
        s.group_instance_id = Some("hookline-dispatcher-0".into());
        s.max_poll_interval_ms = 45_000;
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("group.instance.id"), Some("hookline-dispatcher-0"));
        assert_eq!(c.get("max.poll.interval.ms"), Some("45000"));
        // Table readers are not group members: no instance id there.
        assert_eq!(crate::client::table_consumer_config(&s, "t").unwrap().get("group.instance.id"), None);
    }

    #[test]
    fn the_consumer_group_protocol_leaves_timeouts_and_assignment_to_the_broker() {
        let s: KafkaSettings = toml::from_str("group_protocol = \"consumer\"").unwrap();
        assert_eq!(s.group_protocol, GroupProtocol::Consumer);
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("group.protocol"), Some("consumer"));
        for key in ["session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"] {
            assert_eq!(c.get(key), None, "{key} is the broker's with group.protocol=consumer");
        }
        assert_eq!(c.get("max.poll.interval.ms"), Some("300000"));
        let c = group_consumer_config(&KafkaSettings::default(), "g", "c").unwrap();
        assert_eq!(c.get("group.protocol"), Some("classic"));
        let mut s = KafkaSettings::default();
        s.properties.insert("group.protocol".into(), "consumer".into());
        assert!(invalid(&s).contains("(use kafka.group_protocol)"), "{}", invalid(&s));
    }

    #[test]
    fn poll_interval_and_instance_id_are_checked_with_the_key_named() {
        let s = KafkaSettings { max_poll_interval_ms: 5_000, ..Default::default() };
        assert_eq!(invalid(&s), "kafka.max_poll_interval_ms: must be between kafka.session_timeout_ms (10000) and 86400000, got 5000");
        let s = KafkaSettings { max_poll_interval_ms: 86_400_001, ..Default::default() };
        assert!(invalid(&s).starts_with("kafka.max_poll_interval_ms:"), "{}", invalid(&s));
        for bad in ["", "pod name", "pod/0", &"x".repeat(250)] {
            let s = KafkaSettings { group_instance_id: Some(bad.to_owned()), ..Default::default() };
            assert!(invalid(&s).starts_with("kafka.group_instance_id: must be 1 to 249 characters"), "{bad:?}: {}", invalid(&s));
        }
        for (k, key) in [
            ("max.poll.interval.ms", "kafka.max_poll_interval_ms"),
            ("group.instance.id", "kafka.group_instance_id"),
            ("partition.assignment.strategy", "cooperative-sticky"),
        ] {
            let mut s = KafkaSettings::default();
            s.properties.insert(k.into(), "x".into());
            let e = invalid(&s);
            assert!(e.starts_with(&format!("kafka.properties.{k}: hookline sets this itself")) && e.contains(key), "{e}");
        }
    }

    #[test]
    fn sasl_ssl_with_scram_maps_to_librdkafka_properties() {
        let ca = file("ca.pem", "not checked until a handshake");
        let pw = file("pw", "s3cret-pw\r\n");
        let s = parse(&format!(
            "security_protocol = \"sasl_ssl\"\n[tls]\nca_file = {ca:?}\n[sasl]\nmechanism = \"scram-sha-256\"\nusername = \"svc\"\npassword_file = {pw:?}\n"
        ));
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(c.get("ssl.ca.location"), ca.to_str());
        assert_eq!(c.get("ssl.endpoint.identification.algorithm"), Some("https"));
        assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
        assert_eq!(c.get("sasl.username"), Some("svc"));
        assert_eq!(c.get("sasl.password"), Some("s3cret-pw"), "the file's line ending is not part of the password");
    }

    #[test]
    fn mtls_and_hostname_check_map_to_librdkafka_properties() {
        let mut s = KafkaSettings { security_protocol: SecurityProtocol::Ssl, ..Default::default() };
        s.tls.cert_file = Some(file("client.pem", "cert"));
        s.tls.key_file = Some(file("client.key", "key"));
        s.tls.key_password_file = Some(file("client.key.pw", "keypw\n"));
        s.tls.check_hostname = false;
        s.validate().unwrap();
        let c = crate::client::producer_config(&s, "p").unwrap();
        assert_eq!(c.get("security.protocol"), Some("ssl"));
        assert_eq!(c.get("ssl.certificate.location"), s.tls.cert_file.as_deref().and_then(Path::to_str));
        assert_eq!(c.get("ssl.key.location"), s.tls.key_file.as_deref().and_then(Path::to_str));
        assert_eq!(c.get("ssl.key.password"), Some("keypw"));
        assert_eq!(c.get("ssl.endpoint.identification.algorithm"), Some("none"));
        assert_eq!(c.get("sasl.mechanism"), None);
    }

    /// Ingest's producer (the event, the delivery tasks) lingers `delivery_path_linger_ms`; the others `linger_ms`.
    #[test]
    fn the_delivery_path_producer_has_its_own_linger() {
        let s = KafkaSettings { linger_ms: 7, delivery_path_linger_ms: 2, ..Default::default() };
        assert_eq!(crate::client::producer_config(&s, "p").unwrap().get("linger.ms"), Some("7"));
        assert_eq!(crate::client::delivery_path_producer_config(&s, "p").unwrap().get("linger.ms"), Some("2"));
        assert_eq!(crate::client::delivery_path_producer_config(&s, "p").unwrap().get("acks"), Some("all"));
        assert_eq!(KafkaSettings::default().delivery_path_linger_ms, 0);
    }

    #[test]
    fn producers_compress_with_lz4_unless_the_properties_name_a_codec() {
        let c = crate::client::producer_config(&KafkaSettings::default(), "p").unwrap();
        assert_eq!(c.get("compression.type"), Some("lz4"));
        for codec in ["none", "zstd"] {
            let s = KafkaSettings { properties: [("compression.type".to_owned(), codec.to_owned())].into(), ..Default::default() };
            s.validate().unwrap();
            let c = crate::client::producer_config(&s, "p").unwrap();
            assert_eq!(c.get("compression.type"), Some(codec), "the operator's codec is used, not replaced");
            assert_eq!(c.get("acks"), Some("all"), "the guarantees stay");
        }
        let s = KafkaSettings { properties: [("compression.type".to_owned(), "brotli".to_owned())].into(), ..Default::default() };
        let e = s.validate().unwrap_err();
        assert!(e.starts_with("kafka.properties.compression.type: one of none, gzip, snappy, lz4, zstd"), "{e}");
    }

    #[test]
    fn the_password_can_come_from_the_environment() {
        let var = format!("HOOKLINE_TEST_KAFKA_PW_{}", std::process::id());
        let mut s = scram();
        s.sasl.password_file = None;
        s.sasl.password_env = Some(var.clone());
        assert!(invalid(&s).contains(&format!("kafka.sasl.password_env: the variable {var} is not set")), "{}", invalid(&s));
        std::env::set_var(&var, "from-env");
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("sasl.password"), Some("from-env"));
        std::env::remove_var(&var);
    }

    #[test]
    fn oauthbearer_carries_its_settings_to_the_token_hook() {
        let mut s = KafkaSettings { security_protocol: SecurityProtocol::SaslSsl, ..Default::default() };
        s.sasl.mechanism = Some(SaslMechanism::OAuthBearer);
        s.oauth = OAuthSettings {
            token_endpoint: Some("https://idp.example.com/oauth2/token".into()),
            client_id: Some("hookline".into()),
            client_secret_file: Some(file("client-secret", "cs\n")),
            scope: Some("kafka".into()),
        };
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
        let carried: crate::oauth::OAuthClient = serde_json::from_str(c.get("sasl.oauthbearer.config").unwrap()).unwrap();
        assert_eq!(carried, crate::oauth::OAuthClient::from_settings(&s).unwrap());
        assert!(!c.get("sasl.oauthbearer.config").unwrap().contains("cs"), "the secret itself stays in its file");
    }

    #[test]
    fn inconsistent_security_settings_are_refused_naming_the_key() {
        let mut s = scram();
        s.security_protocol = SecurityProtocol::Ssl;
        assert!(invalid(&s).starts_with("kafka.sasl.mechanism: set, but kafka.security_protocol = \"ssl\""), "{}", invalid(&s));

        let mut s = scram();
        s.sasl.mechanism = None;
        assert!(invalid(&s).starts_with("kafka.sasl.mechanism: required with kafka.security_protocol = \"sasl_ssl\""), "{}", invalid(&s));

        let mut s = scram();
        s.sasl.username = None;
        assert!(invalid(&s).starts_with("kafka.sasl.username: required"), "{}", invalid(&s));

        let mut s = scram();
        s.sasl.password_file = None;
        assert!(invalid(&s).starts_with("kafka.sasl.password_file: required"), "{}", invalid(&s));

        let mut s = scram();
        s.sasl.password_env = Some("X".into());
        assert!(invalid(&s).contains("together with kafka.sasl.password_env"), "{}", invalid(&s));

        let mut s = scram();
        s.sasl.password_file = Some(PathBuf::from("/nonexistent/hookline/pw"));
        assert!(invalid(&s).starts_with("kafka.sasl.password_file: cannot read /nonexistent/hookline/pw"), "{}", invalid(&s));

        let mut s = scram();
        s.sasl.password_file = Some(file("empty-pw", "\n"));
        assert!(invalid(&s).contains("is empty"), "{}", invalid(&s));

        let mut s = KafkaSettings::default();
        s.tls.ca_file = Some(file("ca2.pem", "x"));
        assert!(
            invalid(&s).starts_with("kafka.tls.ca_file: set, but kafka.security_protocol = \"plaintext\" does not use TLS"),
            "{}",
            invalid(&s)
        );

        let mut s = KafkaSettings { security_protocol: SecurityProtocol::Ssl, ..Default::default() };
        s.tls.ca_file = Some(PathBuf::from("/nonexistent/ca.pem"));
        assert!(invalid(&s).starts_with("kafka.tls.ca_file: cannot read /nonexistent/ca.pem"), "{}", invalid(&s));

        let mut s = KafkaSettings { security_protocol: SecurityProtocol::Ssl, ..Default::default() };
        s.tls.cert_file = Some(file("c.pem", "x"));
        assert!(invalid(&s).starts_with("kafka.tls.key_file: required with kafka.tls.cert_file"), "{}", invalid(&s));

        let mut s = KafkaSettings { security_protocol: SecurityProtocol::Ssl, ..Default::default() };
        s.tls.key_file = Some(file("k.pem", "x"));
        assert!(invalid(&s).starts_with("kafka.tls.cert_file: required with kafka.tls.key_file"), "{}", invalid(&s));

        let mut s = KafkaSettings::default();
        s.oauth.client_id = Some("x".into());
        assert!(invalid(&s).starts_with("kafka.oauth: set, but kafka.sasl.mechanism is not \"oauthbearer\""), "{}", invalid(&s));
    }

    #[test]
    fn oauth_settings_are_checked() {
        let base = || {
            let mut s = KafkaSettings { security_protocol: SecurityProtocol::SaslSsl, ..Default::default() };
            s.sasl.mechanism = Some(SaslMechanism::OAuthBearer);
            s.oauth.token_endpoint = Some("https://idp.example.com/token".into());
            s.oauth.client_id = Some("hookline".into());
            s.oauth.client_secret_file = Some(file("cs2", "x"));
            s
        };
        base().validate().unwrap();
        let mut s = base();
        s.oauth.token_endpoint = None;
        assert!(invalid(&s).starts_with("kafka.oauth.token_endpoint: required"), "{}", invalid(&s));
        s.oauth.token_endpoint = Some("http://idp.example.com/token".into());
        assert!(invalid(&s).starts_with("kafka.oauth.token_endpoint: must be an https:// URL"), "{}", invalid(&s));
        s.oauth.token_endpoint = Some("http://127.0.0.1:8080/token".into());
        s.validate().unwrap();
        let mut s = base();
        s.oauth.client_id = None;
        assert!(invalid(&s).starts_with("kafka.oauth.client_id: required"), "{}", invalid(&s));
        let mut s = base();
        s.oauth.client_secret_file = Some(PathBuf::from("/nonexistent/cs"));
        assert!(invalid(&s).starts_with("kafka.oauth.client_secret_file: cannot read"), "{}", invalid(&s));
        let mut s = base();
        s.sasl.username = Some("u".into());
        assert!(invalid(&s).starts_with("kafka.sasl.username: not used with kafka.sasl.mechanism = \"oauthbearer\""), "{}", invalid(&s));
    }

    fn msk_iam() -> KafkaSettings {
        let mut s = KafkaSettings { security_protocol: SecurityProtocol::SaslSsl, ..Default::default() };
        s.sasl.mechanism = Some(SaslMechanism::AwsMskIam);
        s.aws.region = Some("eu-west-1".into());
        s
    }

    #[test]
    fn aws_msk_iam_is_oauthbearer_carrying_the_region_to_the_token_hook() {
        let s = parse("security_protocol = \"sasl_ssl\"\n[sasl]\nmechanism = \"aws_msk_iam\"\n[aws]\nregion = \"eu-west-1\"\n");
        assert_eq!(s, msk_iam());
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(c.get("sasl.oauthbearer.config"), Some(r#"{"aws_msk_iam":{"region":"eu-west-1"}}"#));
        assert_eq!((c.get("sasl.username"), c.get("sasl.password")), (None, None));
        assert_eq!(toml::from_str::<SaslSettings>("mechanism = \"aws-msk-iam\"").unwrap().mechanism, Some(SaslMechanism::AwsMskIam));
        assert!(toml::from_str::<KafkaSettings>("[aws]\nregion = \"eu-west-1\"\nrole_arn = \"x\"").is_err(), "unknown keys are refused");
    }

    #[test]
    fn aws_msk_iam_settings_are_checked_naming_the_key() {
        let mut s = msk_iam();
        s.aws.region = None;
        assert!(invalid(&s).starts_with("kafka.aws.region: required with kafka.sasl.mechanism = \"aws_msk_iam\""), "{}", invalid(&s));
        for bad in ["EU-WEST-1", "eu-west-1.example.com", "eu west 1", "-eu", "eu-west-"] {
            s.aws.region = Some(bad.into());
            assert!(
                invalid(&s).starts_with("kafka.aws.region: ") && invalid(&s).contains("is not an AWS region name"),
                "{bad}: {}",
                invalid(&s)
            );
        }
        let mut s = msk_iam();
        s.security_protocol = SecurityProtocol::SaslPlaintext;
        assert_eq!(
            invalid(&s),
            "kafka.security_protocol: \"sasl_plaintext\" with kafka.sasl.mechanism = \"aws_msk_iam\"; use \"sasl_ssl\""
        );
        let mut s = msk_iam();
        s.sasl.username = Some("u".into());
        assert!(invalid(&s).starts_with("kafka.sasl.username: not used with kafka.sasl.mechanism = \"aws_msk_iam\""), "{}", invalid(&s));
        let mut s = msk_iam();
        s.oauth.client_id = Some("x".into());
        assert!(invalid(&s).starts_with("kafka.oauth: set, but kafka.sasl.mechanism is not \"oauthbearer\""), "{}", invalid(&s));
        let mut s = scram();
        s.aws.region = Some("eu-west-1".into());
        assert_eq!(invalid(&s), "kafka.aws: set, but kafka.sasl.mechanism is not \"aws_msk_iam\"");
    }

    const STRIMZI_JAAS: &str =
        "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"hookline-kafka\" password=\"Zx9/q+w=\\\"k\";";

    #[test]
    fn a_strimzi_jaas_config_gives_the_username_and_password() {
        let mut s = scram();
        s.sasl.username = None;
        s.sasl.password_file = None;
        s.sasl.jaas_config_file = Some(file("sasl.jaas.config", STRIMZI_JAAS));
        s.validate().unwrap();
        let c = group_consumer_config(&s, "g", "c").unwrap();
        assert_eq!(c.get("sasl.username"), Some("hookline-kafka"));
        assert_eq!(c.get("sasl.password"), Some("Zx9/q+w=\"k"));
        assert!(!format!("{s:?}").contains("Zx9"), "the file's contents are not in a dump");

        // Kafka's parser takes bare values, other flags and PLAIN's module too; other options are ignored.
        let (u, p) = parse_jaas_config(
            "org.apache.kafka.common.security.plain.PlainLoginModule optional\n  serviceName=kafka username=svc password=\"a b\";\n",
        )
        .unwrap();
        assert_eq!((u.as_str(), p.expose()), ("svc", "a b"));
    }

    #[test]
    fn a_bad_or_conflicting_jaas_config_is_refused_naming_the_key() {
        let jaas = |text: &str| {
            let mut s = scram();
            s.sasl.username = None;
            s.sasl.password_file = None;
            s.sasl.jaas_config_file = Some(file("jaas", text));
            invalid(&s)
        };
        for (text, why) in [
            ("org.apache.kafka.common.security.scram.ScramLoginModule required username=\"u\" password=\"p\"", "must end with ';'"),
            (
                "com.sun.security.auth.module.Krb5LoginModule required username=\"u\" password=\"p\";",
                "neither ScramLoginModule nor PlainLoginModule",
            ),
            ("org.apache.kafka.common.security.scram.ScramLoginModule username=\"u\" password=\"p\";", "expected a flag (required)"),
            ("org.apache.kafka.common.security.scram.ScramLoginModule required password=\"p\";", "no username"),
            ("org.apache.kafka.common.security.scram.ScramLoginModule required username=\"u\";", "no password"),
            (
                "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"u\" password=\"secret-unterminated;",
                "unterminated",
            ),
            ("s3cret-password-only\n", "must end with ';'"),
        ] {
            let e = jaas(text);
            assert!(e.starts_with("kafka.sasl.jaas_config_file: ") && e.contains(why), "{text}: {e}");
            assert!(!e.contains("secret-unterminated") && !e.contains("s3cret"), "no secret in the message: {e}");
        }
        for (key, set) in [
            ("kafka.sasl.username", &(|s: &mut KafkaSettings| s.sasl.username = Some("u".into())) as &dyn Fn(&mut KafkaSettings)),
            ("kafka.sasl.password_file", &|s: &mut KafkaSettings| s.sasl.password_file = Some(file("pw", "p"))),
            ("kafka.sasl.password_env", &|s: &mut KafkaSettings| s.sasl.password_env = Some("PW".into())),
        ] {
            let mut s = scram();
            s.sasl.username = None;
            s.sasl.password_file = None;
            s.sasl.jaas_config_file = Some(file("jaas", STRIMZI_JAAS));
            set(&mut s);
            assert!(invalid(&s).starts_with(&format!("kafka.sasl.jaas_config_file: set together with {key}")), "{}", invalid(&s));
        }
        let mut s = scram();
        s.sasl.username = None;
        s.sasl.password_file = None;
        s.sasl.jaas_config_file = Some(PathBuf::from("/nonexistent/jaas"));
        assert!(invalid(&s).starts_with("kafka.sasl.jaas_config_file: cannot read /nonexistent/jaas"), "{}", invalid(&s));
        s.sasl.mechanism = Some(SaslMechanism::OAuthBearer);
        assert!(invalid(&s).starts_with("kafka.sasl.username: not used with kafka.sasl.mechanism = \"oauthbearer\""), "{}", invalid(&s));
        let mut s = KafkaSettings::default();
        s.properties.insert("sasl.jaas.config".into(), "x".into());
        assert!(
            invalid(&s).starts_with("kafka.properties.sasl.jaas.config: not accepted here; use kafka.sasl.jaas_config_file"),
            "{}",
            invalid(&s)
        );
    }

    #[test]
    fn security_properties_are_refused_pointing_at_the_keys() {
        for (prop, key) in [
            ("sasl.password", "kafka.sasl.password_file"),
            ("security.protocol", "kafka.security_protocol"),
            ("ssl.key.password", "kafka.tls.key_password_file"),
            ("sasl.oauthbearer.client.secret", "kafka.oauth.client_secret_file"),
        ] {
            let mut s = KafkaSettings::default();
            s.properties.insert(prop.into(), "x".into());
            let e = invalid(&s);
            assert!(e.starts_with(&format!("kafka.properties.{prop}: not accepted here; use {key}")), "{e}");
        }
        let mut s = KafkaSettings::default();
        s.properties.insert("socket.keepalive.enable".into(), "true".into());
        s.validate().unwrap();
    }

    #[test]
    fn a_debug_dump_shows_no_secret() {
        let mut s = scram();
        s.properties.insert("ssl.keystore.password".into(), "hunter2".into());
        let dump = format!("{s:?}");
        assert!(!dump.contains("hunter2") && !dump.contains("s3cret-pw"), "{dump}");
        assert!(dump.contains("[redacted]") && dump.contains("svc-hookline"), "{dump}");
        assert_eq!(format!("{:?}", s.sasl_password().unwrap().unwrap()), "[redacted]");
    }

    #[test]
    fn unknown_mechanisms_and_protocols_are_parse_errors() {
        assert!(toml::from_str::<KafkaSettings>("security_protocol = \"SASL_SSL\"").is_err());
        assert!(toml::from_str::<KafkaSettings>("[sasl]\nmechanism = \"gssapi\"").is_err());
        assert!(toml::from_str::<KafkaSettings>("[tls]\nca_path = \"/x\"").is_err());
    }
}
