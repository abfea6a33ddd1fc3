//! The processes under test: `hookline dev-broker --control` and the three service binaries, each a child of the
//! harness. Every child is killed (SIGKILL) and reaped on drop, so a failing run leaves nothing behind.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// The broker, a separate process driven through its stdin (`hookline dev-broker --control`).
pub struct Broker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub bootstrap_servers: String,
}

impl Broker {
    pub fn start(hookline: &Path, partitions: i32, verbose: bool) -> anyhow::Result<Broker> {
        let mut child = Command::new(hookline)
            .args(["dev-broker", "--control", "--partitions", &partitions.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if verbose { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .with_context(|| format!("starting {} dev-broker", hookline.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut first = String::new();
        stdout.read_line(&mut first).context("reading the dev-broker's first line")?;
        let v: serde_json::Value = serde_json::from_str(&first).with_context(|| format!("dev-broker said {first:?}"))?;
        let bootstrap_servers = v["bootstrap_servers"].as_str().context("bootstrap_servers in the first line")?.to_owned();
        Ok(Broker { child, stdin, stdout, bootstrap_servers })
    }

    /// Sends one control command and waits for its acknowledgement.
    pub fn command(&mut self, cmd: &str) -> anyhow::Result<()> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == format!("ok {cmd}"), "dev-broker answered {:?} to {cmd:?}", line.trim());
        Ok(())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Ingest,
    Dispatcher,
    RetryScheduler,
}

impl Role {
    pub fn binary(self) -> &'static str {
        match self {
            Role::Ingest => "hookline-ingest",
            Role::Dispatcher => "hookline-dispatcher",
            Role::RetryScheduler => "hookline-retry-scheduler",
        }
    }
}

/// One service process slot: started, signalled, restarted. `name` tells the instances of a role apart.
pub struct Service {
    pub name: String,
    bin: PathBuf,
    config: PathBuf,
    verbose: bool,
    /// Without `--verbose`, the service's output goes here (appended over restarts), for the report of a failure.
    log: PathBuf,
    child: Option<Child>,
    pub starts: u32,
}

impl Service {
    pub fn new(role: Role, name: String, bin_dir: &Path, config: &Path, verbose: bool) -> anyhow::Result<Service> {
        let log = config.with_file_name(format!("{name}.log"));
        let bin = bin_dir.join(role.binary());
        anyhow::ensure!(
            bin.is_file(),
            "{} not found: build the binaries first (`cargo build --workspace --bins`, with --release for a release \
             hookline) or pass --bin-dir",
            bin.display()
        );
        Ok(Service { name, bin, config: config.to_owned(), verbose, log, child: None, starts: 0 })
    }

    pub fn start(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "{} is already running", self.name);
        let out = || -> anyhow::Result<Stdio> {
            if self.verbose {
                return Ok(Stdio::inherit());
            }
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&self.log);
            Ok(file.with_context(|| format!("opening {}", self.log.display()))?.into())
        };
        let mut cmd = Command::new(&self.bin);
        // The harness's own environment must not reconfigure the services under test.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HOOKLINE_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(out()?)
            .stderr(out()?)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, sig: libc::c_int) -> anyhow::Result<()> {
        let pid = self.pid().with_context(|| format!("{} is not running", self.name))?;
        // SAFETY: kill(2) on our own child's pid, which stays reserved until we reap it.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        anyhow::ensure!(rc == 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
        Ok(())
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGKILL)?;
        if let Some(mut c) = self.child.take() {
            c.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then wait up to `limit` for the exit (SIGKILL after that, reported as an error).
    pub async fn terminate(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        self.signal(libc::SIGTERM)?;
        let deadline = Instant::now() + limit;
        loop {
            let child = self.child.as_mut().expect("signalled, so running");
            let pid = child.id();
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                // What it was stuck on, before the SIGKILL erases it: the threads' stacks and the log's end.
                eprintln!("soak: {} did not exit within {limit:?} of SIGTERM\n{}", self.name, self.post_mortem(pid));
                self.kill9()?;
                anyhow::bail!("{} did not exit within {limit:?} of SIGTERM", self.name);
            }
            // std's Child has no async wait (tokio's `process` feature is off): a short poll.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The end of the service's log and, when gdb is installed, every thread's stack.
    fn post_mortem(&self, pid: u32) -> String {
        let mut out = String::new();
        if let Ok(log) = std::fs::read_to_string(&self.log) {
            let lines: Vec<&str> = log.lines().collect();
            out.push_str(&format!("--- last lines of {} ---\n", self.log.display()));
            for l in &lines[lines.len().saturating_sub(40)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        let gdb =
            Command::new("gdb").args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt 25"]).stdin(Stdio::null()).output();
        if let Ok(o) = gdb {
            out.push_str("--- thread stacks (gdb) ---\n");
            out.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        out
    }

    pub fn freeze(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    pub fn thaw(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// The exit status if the process exited on its own (a crash the harness did not cause); the slot is then
    /// free to start again.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SIGKILL also ends a frozen (SIGSTOPped) process.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The directory of the service binaries: `--bin-dir`, or the one holding this executable.
pub fn bin_dir(arg: Option<&Path>) -> anyhow::Result<PathBuf> {
    match arg {
        Some(p) => Ok(p.to_owned()),
        None => {
            let exe = std::env::current_exe().context("locating the hookline executable")?;
            Ok(exe.parent().context("the executable's directory")?.to_owned())
        }
    }
}
