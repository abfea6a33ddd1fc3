//! hookline's rules, with no I/O: policies and built-in profiles, the retry engine, Retry-After parsing,
//! endpoint health, request signing and the egress decision. Binaries carry out what these functions decide.

pub mod breaker;
pub mod cloudevents;
pub mod cloudevents_out;
pub mod concurrency;
pub mod credential;
pub mod custom_headers;
pub mod dead_letter;
pub mod egress;
pub mod engine;
pub mod event_decode;
pub mod filter;
pub mod health;
pub mod model;
pub mod ordering;
pub mod outcome;
pub mod payload_filter;
pub mod policy;
pub mod rate_limit;
pub mod registry_framing;
pub mod request;
pub mod retry_after;
pub mod seal;
pub mod sign;
pub mod simulate;
pub mod subscription;
pub mod time;
pub mod trace;
pub mod verification;
pub mod vocabulary;
pub mod words;

pub use engine::{decide, decide_lost_attempt, due_at_ms, DecidedBy, Decision, FinalState, Next, Progress, Verdict, Wait};
pub use outcome::{Outcome, UntriedOutcome};
pub use policy::Policy;
