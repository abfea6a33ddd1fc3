//! One file per subcommand. Each exposes its clap arguments and `run(args) -> anyhow::Result<ExitCode>`.

pub mod bench;
pub mod dev;
pub mod dev_broker;
pub mod dlq;
pub mod egress;
pub mod filter;
pub mod log;
pub mod numbers;
/// Not a subcommand: the human-or-JSON output the listing commands share.
pub mod output;
pub mod policy;
pub mod secrets;
pub mod soak;
pub mod topics;
pub mod verify;
