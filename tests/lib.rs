//! The hookline workspace's integration tests live in `tests/integration/`.
