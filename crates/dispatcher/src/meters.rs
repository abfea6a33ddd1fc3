//! The metrics every delivery updates, as handles looked up once. A `metrics` macro with labels builds its key
//! and looks it up in the recorder's registry (hashing name and labels, a read lock) on every call:
//! about 2 % of the dispatcher's CPU in `bench throughput`'s profile, at five such calls per delivery. A handle is
//! registered at its first use, not at start, so `/metrics` shows a series only once it has counted something, as
//! before.

use std::sync::OnceLock;

use hookline_core::{FinalState, Outcome};
use metrics::{Counter, Gauge, Histogram};

/// `hookline_attempts_total`'s `outcome` label: the class of a try's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    S2xx,
    S3xx,
    S429,
    S4xx,
    S5xx,
    OtherStatus,
    Timeout,
    ConnectError,
    TlsError,
    EgressRefused,
    InvalidUrl,
}

impl OutcomeClass {
    const ALL: [OutcomeClass; 11] = [
        OutcomeClass::S2xx,
        OutcomeClass::S3xx,
        OutcomeClass::S429,
        OutcomeClass::S4xx,
        OutcomeClass::S5xx,
        OutcomeClass::OtherStatus,
        OutcomeClass::Timeout,
        OutcomeClass::ConnectError,
        OutcomeClass::TlsError,
        OutcomeClass::EgressRefused,
        OutcomeClass::InvalidUrl,
    ];

    pub fn of(o: &Outcome) -> Self {
        match o {
            Outcome::Http { status, .. } => match status {
                200..=299 => Self::S2xx,
                300..=399 => Self::S3xx,
                429 => Self::S429,
                400..=499 => Self::S4xx,
                500..=599 => Self::S5xx,
                _ => Self::OtherStatus,
            },
            Outcome::Timeout => Self::Timeout,
            Outcome::ConnectError => Self::ConnectError,
            Outcome::TlsError => Self::TlsError,
            Outcome::EgressRefused => Self::EgressRefused,
            Outcome::InvalidUrl => Self::InvalidUrl,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::S2xx => "2xx",
            Self::S3xx => "3xx",
            Self::S429 => "429",
            Self::S4xx => "4xx",
            Self::S5xx => "5xx",
            Self::OtherStatus => "other_status",
            Self::Timeout => "timeout",
            Self::ConnectError => "connect_error",
            Self::TlsError => "tls_error",
            Self::EgressRefused => "egress_refused",
            Self::InvalidUrl => "invalid_url",
        }
    }
}

/// `hookline_deliveries_total`'s `outcome` label: a final state, or `skipped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Final(FinalState),
    Skipped,
}

impl Ended {
    fn index(self) -> usize {
        match self {
            Ended::Final(FinalState::Succeeded) => 0,
            Ended::Final(FinalState::Failed) => 1,
            Ended::Final(FinalState::Dead) => 2,
            Ended::Final(FinalState::Cancelled) => 3,
            Ended::Skipped => 4,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Final(s) => s.as_str(),
            Ended::Skipped => "skipped",
        }
    }
}

#[derive(Default)]
pub struct Meters {
    in_flight: OnceLock<Gauge>,
    attempts: [OnceLock<Counter>; OutcomeClass::ALL.len()],
    attempt_duration_ms: OnceLock<Histogram>,
    deliveries: [OnceLock<Counter>; 5],
    delivery_latency_ms: OnceLock<Histogram>,
}

impl Meters {
    /// `hookline_dispatcher_in_flight`.
    pub fn in_flight(&self) -> &Gauge {
        self.in_flight.get_or_init(|| metrics::gauge!("hookline_dispatcher_in_flight"))
    }

    /// `hookline_attempts_total{outcome}` of a try's outcome.
    pub fn attempt(&self, outcome: &Outcome) -> &Counter {
        let class = OutcomeClass::of(outcome);
        let i = OutcomeClass::ALL.iter().position(|c| *c == class).unwrap_or(0);
        self.attempts[i].get_or_init(|| metrics::counter!("hookline_attempts_total", "outcome" => class.as_str()))
    }

    /// `hookline_attempt_duration_ms`.
    pub fn attempt_duration_ms(&self) -> &Histogram {
        self.attempt_duration_ms.get_or_init(|| metrics::histogram!("hookline_attempt_duration_ms"))
    }

    /// `hookline_deliveries_total{outcome}`.
    pub fn delivery(&self, ended: Ended) -> &Counter {
        self.deliveries[ended.index()].get_or_init(|| metrics::counter!("hookline_deliveries_total", "outcome" => ended.as_str()))
    }

    /// `hookline_delivery_latency_ms`.
    pub fn delivery_latency_ms(&self) -> &Histogram {
        self.delivery_latency_ms.get_or_init(|| metrics::histogram!("hookline_delivery_latency_ms"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handles count under the names and labels the macros used (docs/metrics.md), each series its own, and a
    /// series shows only once used.
    #[test]
    fn handles_count_under_the_documented_names_and_labels() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let m = Meters::default();
            m.attempt(&Outcome::http(204)).increment(1);
            m.attempt(&Outcome::http(201)).increment(1);
            m.attempt(&Outcome::http(503)).increment(1);
            m.attempt(&Outcome::Timeout).increment(1);
            m.delivery(Ended::Final(FinalState::Succeeded)).increment(2);
            m.delivery(Ended::Skipped).increment(1);
            m.in_flight().set(7.0);
        });
        let text = handle.render();
        let mut lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                r#"hookline_attempts_total{outcome="2xx"} 2"#,
                r#"hookline_attempts_total{outcome="5xx"} 1"#,
                r#"hookline_attempts_total{outcome="timeout"} 1"#,
                r#"hookline_deliveries_total{outcome="skipped"} 1"#,
                r#"hookline_deliveries_total{outcome="succeeded"} 2"#,
                "hookline_dispatcher_in_flight 7",
            ]
        );
    }

    #[test]
    fn every_class_and_end_has_its_documented_word() {
        let words: Vec<&str> = OutcomeClass::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            words,
            ["2xx", "3xx", "429", "4xx", "5xx", "other_status", "timeout", "connect_error", "tls_error", "egress_refused", "invalid_url"]
        );
        let ends = [
            Ended::Final(FinalState::Succeeded),
            Ended::Final(FinalState::Failed),
            Ended::Final(FinalState::Dead),
            Ended::Final(FinalState::Cancelled),
            Ended::Skipped,
        ];
        assert_eq!(ends.map(Ended::index), [0, 1, 2, 3, 4]);
        assert_eq!(ends.map(Ended::as_str), ["succeeded", "failed", "dead", "cancelled", "skipped"]);
    }
}
