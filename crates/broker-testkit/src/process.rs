//! Starting and stopping the real `broker-server` binary for end-to-end tests.
//!
//! The server listens on `127.0.0.1:0`; the harness reads the `listening on <address>` line it
//! prints when ready (no sleeps, no fixed ports) and kills the process (by its pid) when
//! dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `broker-server` binary in the running test's target directory (Cargo builds it for the
/// server's own tests and for `cargo test --workspace`).
pub fn server_binary() -> PathBuf {
    binary("broker-server")
}

/// The binary `name` (`broker-server`, `broker`) in the running test's target directory.
pub fn binary(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("test executable path");
    dir.pop(); // deps/
    dir.pop(); // debug/ or release/
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} does not exist: run `cargo test --workspace` (or `cargo build --bins`)",
        path.display()
    );
    path
}

/// The `broker-server` command for a server started with `extra`: a suite run against a
/// broker of several shards (`BROKER_SHARDS`) starts its cluster nodes as a cluster node runs,
/// with one; a suite run against clusters of several groups (`BROKER_CLUSTER_DATA_GROUPS`,
/// which the server reads) starts its single servers alone, as the setting is a cluster
/// node's only.
fn server_command(extra: &[&str]) -> Command {
    let mut command = Command::new(server_binary());
    match extra.contains(&"--node-id") {
        true => command.env_remove("BROKER_SHARDS"),
        false => command.env_remove("BROKER_CLUSTER_DATA_GROUPS"),
    };
    command
}

/// What a server that refused to start left behind.
#[derive(Debug)]
pub struct Refusal {
    /// Its exit status.
    pub status: ExitStatus,
    /// What it printed on standard output (nothing, if it never announced an address).
    pub stdout: String,
    /// What it printed on standard error: why it refused.
    pub stderr: String,
}

/// Runs `broker-server --listen 127.0.0.1:0 <extra>` expecting it to refuse to start: waits up
/// to `limit` for it to exit. Panics (after killing it) if it is still running then.
pub fn refused_start(extra: &[&str], limit: Duration) -> Refusal {
    refused_start_with(extra, &[], limit)
}

/// [`refused_start`] with the environment variables `env` set (`RUST_LOG` among them, if
/// given; otherwise it is removed).
pub fn refused_start_with(extra: &[&str], env: &[(&str, &str)], limit: Duration) -> Refusal {
    try_refused_start(extra, env, limit)
        .unwrap_or_else(|| panic!("broker-server started, or did not exit within {limit:?}"))
}

/// [`refused_start_with`] that, when the server is still running after `limit` (it started),
/// kills it and returns `None`.
pub fn try_refused_start(extra: &[&str], env: &[(&str, &str)], limit: Duration) -> Option<Refusal> {
    let mut child = server_command(extra)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start broker-server");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("poll the child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("collect the output");
    Some(Refusal {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// A running `broker-server` process.
pub struct ServerProcess {
    child: Child,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The address of its metrics endpoint, when started with `--metrics-listen`.
    pub metrics_addr: Option<SocketAddr>,
    /// The address of its Kafka listener, when started with `--kafka-listen`.
    pub kafka_addr: Option<SocketAddr>,
    /// The address of its web console, when started with `--console-listen`.
    pub console_addr: Option<SocketAddr>,
}

impl ServerProcess {
    /// Starts the server with `--listen 127.0.0.1:0` and `extra` flags, and waits until it has
    /// printed its address.
    pub fn start(extra: &[&str]) -> ServerProcess {
        ServerProcess::start_with(extra, &[], Stdio::inherit())
    }

    /// [`ServerProcess::start`] with the environment variables `env` set and standard error
    /// (the logs) sent to `stderr`, such as a file the test reads afterwards.
    pub fn start_with(extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> ServerProcess {
        ServerProcess::spawn("127.0.0.1:0", extra, env, stderr)
    }

    /// [`ServerProcess::start`] listening on `addr`: the address of a server this one replaces
    /// (killed or stopped), so that clients find it where they left the old one. While no
    /// server listens there, the kernel may give the port to a connection going out of this
    /// host as its own end (clients and nodes reset a connection that reached its own port at
    /// once, but a connection elsewhere may hold it for a while), so a start that fails is tried
    /// again for 20 seconds.
    pub fn start_on(addr: SocketAddr, extra: &[&str]) -> ServerProcess {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let started = ServerProcess::try_spawn(&addr.to_string(), extra, &[], Stdio::inherit());
            if let Some(server) = started {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "broker-server could not start on {addr}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn spawn(listen: &str, extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> ServerProcess {
        ServerProcess::try_spawn(listen, extra, env, stderr)
            .unwrap_or_else(|| panic!("broker-server exited before announcing its address"))
    }

    /// Starts the server; `None` if it exits before announcing its address.
    fn try_spawn(
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Option<ServerProcess> {
        let mut child = server_command(extra)
            .args(["--listen", listen])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start broker-server");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the first line of broker-server");
        if line.is_empty() {
            let _ = child.wait();
            return None;
        }
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("a socket address");
        let mut announced = |prefix: &str, suffix: &str| {
            line.clear();
            stdout
                .read_line(&mut line)
                .expect("read an address line of broker-server");
            line.trim()
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(suffix))
                .unwrap_or_else(|| panic!("expected {prefix}ADDRESS{suffix}, got {line:?}"))
                .parse()
                .expect("a socket address")
        };
        let metrics_addr = extra
            .contains(&"--metrics-listen")
            .then(|| announced("metrics on http://", "/metrics"));
        let kafka_addr = extra
            .contains(&"--kafka-listen")
            .then(|| announced("kafka on ", ""));
        let console_addr = extra.contains(&"--console-listen").then(|| {
            let tls = extra.contains(&"--tls-cert");
            announced(
                if tls {
                    "console on https://"
                } else {
                    "console on http://"
                },
                "/",
            )
        });
        Some(ServerProcess {
            child,
            addr,
            metrics_addr,
            kafka_addr,
            console_addr,
        })
    }

    /// The address as `"127.0.0.1:PORT"`.
    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A memory field of the process's `/proc/<pid>/status` in bytes, such as `VmRSS` or
    /// `VmHWM` (peak resident memory).
    pub fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status
            .lines()
            .find(|line| line.starts_with(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid()));
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|value| value.parse().ok())
            .unwrap();
        kib * 1024
    }

    /// Sends SIGTERM (what `docker stop` sends) and waits up to `limit` for the process to exit.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        self.wait(limit)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to exit on its own.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the child") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "broker-server did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
