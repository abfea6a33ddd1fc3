//! The shutdown signal. Binaries create the token in `main` and pass it down; nothing here is global.

use tokio_util::sync::CancellationToken;

/// A token cancelled on SIGTERM or Ctrl-C. Must be called inside a tokio runtime.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received: draining");
        t.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs a binary's main future on a multi-threaded runtime, then leaves without waiting more than a moment for
/// blocking calls still running (a metadata or watermark lookup of a stopped reader lasts up to its own timeout):
/// once the drain is done, SIGTERM ends the process at once. A `#[tokio::main]` runtime would wait for them.
pub fn run_main(main: impl std::future::Future<Output = std::process::ExitCode>) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(main);
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
