//! One file per subcommand. Each exposes its clap arguments and `run(args) -> anyhow::Result<ExitCode>`.

pub mod bench;
pub mod dev;
pub mod dev_broker;
pub mod egress;
pub mod numbers;
pub mod policy;
pub mod soak;
pub mod topics;
pub mod verify;
