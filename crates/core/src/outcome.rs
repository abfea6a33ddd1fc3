//! The outcome of one HTTP try, in the vocabulary policies classify.

use std::fmt;

/// What one try produced. `Http` carries the raw `Retry-After` header, parsed later by the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Http {
        status: u16,
        retry_after: Option<String>,
    },
    /// No complete response within the policy's timeout (connect + read together).
    Timeout,
    /// DNS failure, refused or reset connection, or a malformed response.
    ConnectError,
    TlsError,
    /// The egress guard refused the destination (non-public address, blocked host, disallowed scheme).
    EgressRefused,
    /// The URL cannot be parsed or has no usable host.
    InvalidUrl,
}

impl Outcome {
    pub fn http(status: u16) -> Self {
        Outcome::Http { status, retry_after: None }
    }

    /// The token used in policies, attempt records and `policy simulate` output: `"503"`, `"timeout"`, ...
    pub fn token(&self) -> String {
        match self {
            Outcome::Http { status, .. } => status.to_string(),
            Outcome::Timeout => "timeout".into(),
            Outcome::ConnectError => "connect_error".into(),
            Outcome::TlsError => "tls_error".into(),
            Outcome::EgressRefused => "egress_refused".into(),
            Outcome::InvalidUrl => "invalid_url".into(),
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.token())
    }
}

/// The outcome of an attempt record written without an HTTP try: why the attempt ended (or, for a lost one,
/// went on) before anything was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UntriedOutcome {
    /// The delivery's subscription was deleted.
    SubscriptionDeleted,
    /// The subscription's policy does not load.
    InvalidPolicy,
    /// The attempt was in flight when its dispatcher stopped.
    LeaseExpired,
    /// The subscription is not active and its policy cancels or skips its deliveries.
    Inactive,
    /// The event's body is over the policy's limit.
    Oversize,
}

impl UntriedOutcome {
    /// The record's `outcome` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SubscriptionDeleted => "subscription_deleted",
            Self::InvalidPolicy => "invalid_policy",
            Self::LeaseExpired => "lease_expired",
            Self::Inactive => "inactive",
            Self::Oversize => "oversize",
        }
    }
}
