//! A subscription's effective state: what its owner set (enabled, paused) combined with what the dispatcher
//! decided (auto-pause or auto-disable). Each side writes its own record; an automatic decision applies only to
//! the resume generation it was made in, so a user's resume wins without rewriting the dispatcher's record.

use crate::model::{EndpointCondition, EndpointState, Subscription, VerificationState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    Active,
    /// Switched off by its owner (`enabled: false`).
    Disabled,
    /// Paused by its owner.
    Paused,
    /// Paused by the policy's disable rule, with its reason.
    AutoPaused(String),
    /// Disabled by the policy's disable rule, with its reason (`disabled_reason`).
    AutoDisabled(String),
    /// Its policy asks for endpoint verification and the endpoint has not answered a challenge yet (or its URL
    /// changed since). Deliveries are held, whatever the policy's `inactive` rule: they wait for the endpoint.
    PendingVerification,
}

impl Activity {
    pub fn is_active(&self) -> bool {
        matches!(self, Activity::Active)
    }

    /// The word shown in the API: `active`, `paused` or `disabled`.
    pub fn word(&self) -> &'static str {
        match self {
            Activity::Active => "active",
            Activity::Paused | Activity::AutoPaused(_) => "paused",
            Activity::Disabled | Activity::AutoDisabled(_) => "disabled",
            Activity::PendingVerification => "pending_verification",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Activity::AutoPaused(r) | Activity::AutoDisabled(r) => Some(r),
            Activity::Paused => Some("paused_by_user"),
            Activity::Disabled => Some("disabled_by_user"),
            Activity::PendingVerification => Some("pending_verification"),
            Activity::Active => None,
        }
    }
}

pub fn activity(sub: &Subscription, state: Option<&EndpointState>) -> Activity {
    activity_of(
        Switches { enabled: sub.enabled, paused: sub.paused, verification: sub.verification, resume_generation: sub.resume_generation },
        state,
    )
}

/// The owner's side of [`activity`]: what a process that holds subscriptions in another form passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    pub enabled: bool,
    pub paused: bool,
    /// A `VerificationState`.
    pub verification: i32,
    pub resume_generation: u64,
}

/// [`activity`] from the subscription's switches.
pub fn activity_of(sub: Switches, state: Option<&EndpointState>) -> Activity {
    if !sub.enabled {
        return Activity::Disabled;
    }
    if sub.paused {
        return Activity::Paused;
    }
    if sub.verification == VerificationState::Pending as i32 {
        return Activity::PendingVerification;
    }
    match state {
        Some(st) if st.generation == sub.resume_generation => match EndpointCondition::try_from(st.condition) {
            Ok(EndpointCondition::Paused) => Activity::AutoPaused(st.reason.clone()),
            Ok(EndpointCondition::Disabled) => Activity::AutoDisabled(st.reason.clone()),
            _ => Activity::Active,
        },
        _ => Activity::Active,
    }
}

/// An endpoint's health at a glance (the portal's badge, the API's `health`), in the endpoint condition's words:
/// what its owner or its policy switched off first, then whether its recent attempts fail. A subscription held
/// for verification is `paused` (nothing is sent to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Failing,
    Paused,
    Disabled,
}

impl Health {
    pub const ALL: [Health; 4] = [Health::Healthy, Health::Failing, Health::Paused, Health::Disabled];

    pub fn word(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Failing => "failing",
            Health::Paused => "paused",
            Health::Disabled => "disabled",
        }
    }
}

/// The health of an endpoint in `activity` with the dispatcher's `state`: an active one fails while it has counted
/// failures since its last success (a record of an older resume generation still counts them: a resume does not
/// make the endpoint answer).
pub fn health(activity: &Activity, state: Option<&EndpointState>) -> Health {
    match activity {
        Activity::Disabled | Activity::AutoDisabled(_) => Health::Disabled,
        Activity::Paused | Activity::AutoPaused(_) | Activity::PendingVerification => Health::Paused,
        Activity::Active => match state {
            Some(st) if st.consecutive_failures > 0 || st.condition == EndpointCondition::Failing as i32 => Health::Failing,
            _ => Health::Healthy,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(gen: u64) -> Subscription {
        Subscription { id: "s".into(), enabled: true, resume_generation: gen, ..Default::default() }
    }

    #[test]
    fn health_shows_what_is_switched_off_then_failures() {
        let failing = EndpointState { condition: EndpointCondition::Failing as i32, consecutive_failures: 46, ..Default::default() };
        // An active subscription whose endpoint failed 46 times in a row is not healthy.
        assert_eq!(health(&Activity::Active, Some(&failing)), Health::Failing);
        assert_eq!(health(&Activity::Active, None), Health::Healthy);
        assert_eq!(health(&Activity::Active, Some(&EndpointState::default())), Health::Healthy);
        // Resumed after an auto-pause, before any new success: the old record's failures still count.
        let old_pause =
            EndpointState { condition: EndpointCondition::Paused as i32, consecutive_failures: 3, generation: 1, ..Default::default() };
        assert_eq!(health(&activity(&sub(2), Some(&old_pause)), Some(&old_pause)), Health::Failing);
        assert_eq!(health(&activity(&sub(1), Some(&old_pause)), Some(&old_pause)), Health::Paused);
        assert_eq!(health(&Activity::Paused, Some(&failing)), Health::Paused);
        assert_eq!(health(&Activity::PendingVerification, None), Health::Paused);
        assert_eq!(health(&Activity::AutoDisabled("x".into()), Some(&failing)), Health::Disabled);
        assert_eq!(health(&Activity::Disabled, None), Health::Disabled);
        let words: Vec<&str> = Health::ALL.iter().map(|h| h.word()).collect();
        assert_eq!(words, crate::vocabulary::ENDPOINT_CONDITIONS, "the endpoint condition's words");
    }

    #[test]
    fn owner_settings_win_then_auto_decisions_of_the_current_generation() {
        let disabled = EndpointState {
            condition: EndpointCondition::Disabled as i32,
            reason: "consecutive_failures".into(),
            generation: 3,
            ..Default::default()
        };
        assert_eq!(activity(&sub(3), Some(&disabled)), Activity::AutoDisabled("consecutive_failures".into()));
        // The owner re-enabled it (generation bumped): the old automatic decision no longer applies.
        assert!(activity(&sub(4), Some(&disabled)).is_active());
        assert_eq!(activity(&Subscription { paused: true, ..sub(4) }, None), Activity::Paused);
        assert_eq!(activity(&Subscription { enabled: false, ..sub(4) }, None).word(), "disabled");
        assert!(activity(&sub(0), None).is_active());
        let pending = Subscription { verification: VerificationState::Pending as i32, ..sub(4) };
        assert_eq!(activity(&pending, None), Activity::PendingVerification);
        assert_eq!(activity(&pending, None).word(), "pending_verification");
        assert_eq!(activity(&Subscription { paused: true, ..pending }, None), Activity::Paused, "the owner's pause shows first");
        assert!(activity(&Subscription { verification: VerificationState::Verified as i32, ..sub(4) }, None).is_active());
    }
}
