//! One word per concept, everywhere (API, CLI, metrics labels, portal, docs): the lists here are the source, and
//! the vocabulary table in docs/api.md is tested against them (crates/api/tests/vocabulary.rs).

use crate::engine::FinalState;
use crate::model::EndpointCondition;

/// A delivery's `state`: `pending` until a final state, then hookline's own word for it. (The profile's own word
/// is `platform_status`, e.g. Fynapse's `DEAD_LETTER`.)
pub const DELIVERY_STATES: [&str; 6] = ["pending", "succeeded", "failed", "dead", "cancelled", "skipped"];

/// Whether `word` is a delivery state.
pub fn is_delivery_state(word: &str) -> bool {
    DELIVERY_STATES.contains(&word)
}

/// The final states a policy can end a delivery in (what `FinalState::as_str` returns), plus `skipped`.
pub fn final_states() -> [&'static str; 5] {
    [FinalState::Succeeded.as_str(), FinalState::Failed.as_str(), FinalState::Dead.as_str(), FinalState::Cancelled.as_str(), "skipped"]
}

/// A subscription's `endpoint_condition`, in short words: what its endpoint's recent attempts say.
pub const ENDPOINT_CONDITIONS: [&str; 4] = ["healthy", "failing", "paused", "disabled"];

/// The word for a stored condition. No record yet (`Unspecified`) means no failure either: `healthy`.
pub fn endpoint_condition(raw: i32) -> &'static str {
    match EndpointCondition::try_from(raw) {
        Ok(EndpointCondition::Failing) => "failing",
        Ok(EndpointCondition::Paused) => "paused",
        Ok(EndpointCondition::Disabled) => "disabled",
        Ok(EndpointCondition::Healthy | EndpointCondition::Unspecified) | Err(_) => "healthy",
    }
}

/// The words of a subscription's `verification`.
pub const VERIFICATION_STATES: [&str; 3] = ["not_required", "pending", "verified"];

/// The API's word for a subscription's `verification` field.
pub fn verification_state(raw: i32) -> &'static str {
    match crate::model::VerificationState::try_from(raw) {
        Ok(crate::model::VerificationState::Pending) => "pending",
        Ok(crate::model::VerificationState::Verified) => "verified",
        Ok(crate::model::VerificationState::Unspecified) | Err(_) => "not_required",
    }
}

/// Why a record was dead-lettered: the `reason` of every `DeadLetter` and the `reason` label of
/// `hookline_dead_lettered_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    /// A delivery's final try was classified `terminal` (e.g. a 410 under most profiles).
    TerminalOutcome,
    /// A delivery used every attempt (or its window) and the policy's exhaustion is `dead`.
    RetriesExhausted,
    /// A delivery's attempt was in flight when its dispatcher stopped, and the policy ended it there.
    LeaseExpired,
    /// A delivery's event is larger than its policy's body limit.
    Oversize,
    /// A delivery's subscription has a policy that does not load.
    InvalidPolicy,
    /// An internal record (delivery task, retry envelope) that does not decode.
    InvalidTask,
    /// Handling a delivery panicked (a bug in hookline): it is dead-lettered with the panic's message, so its
    /// partition goes on and the delivery can be redriven once the bug is fixed.
    InternalError,
    /// Input events that could not be read (written by ingest, with no delivery).
    EventEmpty,
    EventInvalidJson,
    EventInvalidProtobuf,
    EventInvalidUtf8,
    EventMissingField,
    EventInvalidField,
    EventOversize,
    /// A Schema Registry framed event whose payload is Avro or Protobuf, with no registry configured to read it.
    EventSchemaRegistryRequired,
    /// A Schema Registry framed event whose schema id the registry does not have.
    EventSchemaNotFound,
    /// A Schema Registry framed event whose schema hookline cannot use (it does not compile, or is of a type it
    /// does not read).
    EventSchemaUnsupported,
    /// A Schema Registry framed event whose header, message indexes or payload do not read with its schema.
    EventInvalidFraming,
}

impl DeadLetterReason {
    pub const ALL: [DeadLetterReason; 18] = [
        Self::TerminalOutcome,
        Self::RetriesExhausted,
        Self::LeaseExpired,
        Self::Oversize,
        Self::InvalidPolicy,
        Self::InvalidTask,
        Self::InternalError,
        Self::EventEmpty,
        Self::EventInvalidJson,
        Self::EventInvalidProtobuf,
        Self::EventInvalidUtf8,
        Self::EventMissingField,
        Self::EventInvalidField,
        Self::EventOversize,
        Self::EventSchemaRegistryRequired,
        Self::EventSchemaNotFound,
        Self::EventSchemaUnsupported,
        Self::EventInvalidFraming,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::TerminalOutcome => "terminal_outcome",
            Self::RetriesExhausted => "retries_exhausted",
            Self::LeaseExpired => "lease_expired",
            // Deliveries and events share the word: the record's `delivery_id` tells them apart.
            Self::Oversize | Self::EventOversize => "oversize",
            Self::InvalidPolicy => "invalid_policy",
            Self::InvalidTask => "invalid_task",
            Self::InternalError => "internal_error",
            Self::EventEmpty => "empty",
            Self::EventInvalidJson => "invalid_json",
            Self::EventInvalidProtobuf => "invalid_protobuf",
            Self::EventInvalidUtf8 => "invalid_utf8",
            Self::EventMissingField => "missing_field",
            Self::EventInvalidField => "invalid_field",
            Self::EventSchemaRegistryRequired => "schema_registry_required",
            Self::EventSchemaNotFound => "schema_not_found",
            Self::EventSchemaUnsupported => "schema_unsupported",
            Self::EventInvalidFraming => "invalid_framing",
        }
    }

    /// Whether the dead letter is a delivery's (it carries the event and can be redriven).
    pub fn is_delivery(self) -> bool {
        matches!(
            self,
            Self::TerminalOutcome
                | Self::RetriesExhausted
                | Self::LeaseExpired
                | Self::Oversize
                | Self::InvalidPolicy
                | Self::InternalError
        )
    }

    /// An event's Schema Registry reasons: only records of the events topic (never an API body) can carry them.
    pub fn is_schema_registry(self) -> bool {
        matches!(
            self,
            Self::EventSchemaRegistryRequired | Self::EventSchemaNotFound | Self::EventSchemaUnsupported | Self::EventInvalidFraming
        )
    }

    /// The reasons a delivery's dead letter can carry: what a redrive can filter on.
    pub fn delivery_words() -> Vec<&'static str> {
        Self::ALL.iter().filter(|r| r.is_delivery()).map(|r| r.as_str()).collect()
    }

    /// Every distinct word, in the order of `ALL`.
    pub fn words() -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for r in Self::ALL {
            if !out.contains(&r.as_str()) {
                out.push(r.as_str());
            }
        }
        out
    }

    /// The delivery reason named `word`, if there is one.
    pub fn delivery_reason(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.is_delivery() && r.as_str() == word)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_lowercase_and_deliveries_are_a_subset() {
        let words = DeadLetterReason::words();
        assert_eq!(words.len(), 17, "oversize is shared by deliveries and events: {words:?}");
        assert!(words.iter().all(|w| w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')));
        assert_eq!(
            DeadLetterReason::delivery_words(),
            ["terminal_outcome", "retries_exhausted", "lease_expired", "oversize", "invalid_policy", "internal_error"]
        );
        assert_eq!(DeadLetterReason::delivery_reason("oversize"), Some(DeadLetterReason::Oversize));
        assert_eq!(DeadLetterReason::delivery_reason("invalid_json"), None, "an event's reason: nothing to redrive");
        assert_eq!(DeadLetterReason::delivery_reason("terminal_response"), None);
    }

    #[test]
    fn final_states_are_delivery_states() {
        for s in final_states() {
            assert!(is_delivery_state(s), "{s}");
        }
    }

    #[test]
    fn conditions_are_short_words() {
        for (raw, want) in [(0, "healthy"), (1, "healthy"), (2, "failing"), (3, "paused"), (4, "disabled"), (99, "healthy")] {
            assert_eq!(endpoint_condition(raw), want);
        }
        assert!(ENDPOINT_CONDITIONS.iter().all(|w| (0..5).any(|r| endpoint_condition(r) == *w)));
    }
}
