//! The policies the benches give their subscriptions.

use hookline_core::policy::Policy;

/// The `standard` profile with one retry exactly `wait_s` after the first attempt (no jitter, no window): a
/// delivery's second attempt is the retry the bench measures or relies on.
pub fn one_retry(name: &str, wait_s: f64) -> Policy {
    let mut p = hookline_core::policy::builtin("standard").expect("built-in profile");
    p.name = name.to_owned();
    p.schedule.waits_s = Some(vec![wait_s]);
    p.schedule.exponential = None;
    p.schedule.max_attempts = Some(2);
    p.schedule.jitter = None;
    p.schedule.max_window_s = None;
    p
}
