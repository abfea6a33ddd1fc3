//! Cross-crate integration tests: one binary.
