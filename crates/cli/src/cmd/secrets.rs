//! `hookline secrets`: master keys that seal subscriptions' signing secrets in the `subscriptions` topic.
//! `generate-key` prints a new key entry for `secrets.keys` (or a line of `secrets.keys_file`); `check` loads the
//! configured keys as the services do and names them (never their material).

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum SecretsCmd {
    /// Print a new master key as `<id>:<base64 of 32 random bytes>`, for `secrets.keys` or `secrets.keys_file`.
    /// Make it once and keep it (a file): a service restarted with another key cannot open what the first sealed.
    GenerateKey {
        /// The key's id (1-64 ASCII letters, digits, `-`, `_`, `.`), stored with every secret it seals. Default:
        /// `k`, today's date and a random suffix, e.g. `k20260315-3fa9c1` (unique: two keys never share an id).
        #[arg(long)]
        id: Option<String>,
    },
    /// Load the configured master keys as ingest and the dispatcher do and print their ids and the write key.
    Check {
        /// The config file (TOML). `HOOKLINE_<SECTION>__<KEY>` environment variables override it.
        #[arg(long, env = "HOOKLINE_CONFIG")]
        config: Option<PathBuf>,
    },
}

pub fn run(cmd: SecretsCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        SecretsCmd::GenerateKey { id } => {
            // The date tells an operator how old a key is; the random suffix keeps two keys made the same day apart
            // (a secret sealed with one must never be taken for the other's).
            let id = id.unwrap_or_else(|| {
                let days = hookline_service::now_ms().div_euclid(86_400_000);
                let (y, m, d) = civil_from_days(days);
                format!("k{y:04}{m:02}{d:02}-{:06x}", rand::random::<u32>() & 0xff_ffff)
            });
            // Checked the way the services will read it.
            let entry = hookline_core::seal::generate_entry(&id, &mut rand::rng());
            hookline_core::seal::parse_entry(&entry).map_err(|e| anyhow::anyhow!("--id: {e}"))?;
            println!("{entry}");
            Ok(ExitCode::SUCCESS)
        }
        SecretsCmd::Check { config } => {
            let config = hookline_service::Config::load(config.as_deref(), std::env::vars())?;
            let keyring = config.secrets.keyring()?;
            println!("keys: {}", keyring.ids().join(", "));
            println!("write key: {}", keyring.write_key_id());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's civil-from-days).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_527), (2026, 3, 15));
    }
}
