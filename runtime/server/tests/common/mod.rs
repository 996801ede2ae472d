//! Starting a real `modelfleet-runtime serve` process on a generated model for the HTTP tests.

#![allow(dead_code)]

use modelfleet_runtime::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
/// The real SmolLM2-135M-Instruct weights (the testkit's fixture).
#[allow(unused_imports)] // not every test binary that includes this module uses it
pub use modelfleet_testkit::fixtures::smollm2_gguf;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server; killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub admin_port: u16,
    pub dir: tempfile::TempDir,
    pub model: PathBuf,
}

impl Server {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The admin listener (adapters, and `/metrics` without a token).
    pub fn admin_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    /// Stderr and stdout so far are not collected (inherited); this reads nothing.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes the tiny model into `dir/model`.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny");
    gen_model(
        &model,
        &GenModelOptions {
            shape: Shape::Tiny,
            seed: 7,
            dtype: GenDType::F32,
            format: GenFormat::Safetensors,
        },
    )
    .unwrap();
    model
}

/// Starts `serve --model <tiny> <extra…>` and waits until `/health` answers.
pub fn start(extra: &[&str], setup: impl FnOnce(&Path) -> Vec<String>) -> Server {
    Launch::tiny(extra).start(setup)
}

/// How a test starts `serve --model <model> --served-model-name <name> <args…>`: its state directory,
/// where its stdout (its usage records) goes, and environment variables set on it (e.g.
/// `MODELFLEET_MEMORY_LIMIT_BYTES`, as a pod's downward API sets it).
pub struct Launch {
    pub dir: tempfile::TempDir,
    pub model: PathBuf,
    pub name: String,
    pub args: Vec<String>,
    pub stdout: fn() -> Stdio,
    pub env: Vec<(String, String)>,
}

impl Launch {
    /// `model` served as `name` with `args`, state in `dir`.
    pub fn model(dir: tempfile::TempDir, model: PathBuf, name: &str, args: &[&str]) -> Self {
        Self {
            dir,
            model,
            name: name.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stdout: Stdio::null,
            env: Vec::new(),
        }
    }

    /// The real SmolLM2-135M-Instruct (Q4_1) served as `smollm2` on 2 threads, 8 sequences and a context
    /// of 1,024 tokens, with `extra`.
    pub fn smollm2(extra: &[&str]) -> Self {
        let args: Vec<&str> = ["--threads", "2", "--max-num-seqs", "8", "--max-model-len", "1024"]
            .iter()
            .chain(extra)
            .copied()
            .collect();
        Self::model(tempfile::tempdir().unwrap(), smollm2_gguf(), "smollm2", &args)
    }

    /// The tiny generated model, one thread, and `extra`.
    pub fn tiny(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_model(dir.path());
        let args: Vec<&str> = ["--threads", "1"].iter().chain(extra).copied().collect();
        Self::model(dir, model, "tiny", &args)
    }

    /// With the variable `key` set to `value` on the server.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// With the server's stdout going to what `stdout` makes (`Stdio::piped`; made again for a retry).
    pub fn stdout(mut self, stdout: fn() -> Stdio) -> Self {
        self.stdout = stdout;
        self
    }

    /// Starts it, with the flags `setup` computes from the state directory after `args`, and waits
    /// until `/health` answers.
    pub fn start(self, setup: impl FnOnce(&Path) -> Vec<String>) -> Server {
        let more = setup(self.dir.path());
        let Launch {
            dir,
            model,
            name,
            args,
            stdout,
            env,
        } = self;
        // A port `free_port` saw free may be taken before the server binds it (by a parallel test, or
        // as the local port of any outgoing connection): a server that exits at once is started again
        // on other ports.
        for attempt in 1.. {
            let (port, admin_port) = (free_port(), free_port());
            let mut child = Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
                .arg("serve")
                .arg("--model")
                .arg(&model)
                .args(["--served-model-name", &name])
                .args([
                    "--port",
                    &port.to_string(),
                    "--admin-port",
                    &admin_port.to_string(),
                ])
                .args(&args)
                .args(&more)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env_remove("POD_IP")
                .stdout(stdout())
                .spawn()
                .unwrap();
            match wait_healthy(&mut child, port) {
                Ok(()) => {
                    return Server {
                        child,
                        port,
                        admin_port,
                        dir,
                        model,
                    };
                }
                Err(exit) if attempt < 3 => {
                    eprintln!("the server exited at start ({exit}); again on other ports");
                }
                Err(exit) => panic!("the server exited at start three times, last: {exit}"),
            }
        }
        unreachable!()
    }
}

/// Waits until `/health` on `port` answers 200; `Err` with the exit status when the server exited
/// first (killed, then a panic, when neither happens within 60 s).
fn wait_healthy(child: &mut Child, port: u16) -> Result<(), std::process::ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Ok(Some(exit)) = child.try_wait() {
            return Err(exit);
        }
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::Write;
            let _ = c.write_all(b"GET /health HTTP/1.0\r\n\r\n");
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            if out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the server did not become healthy in 60 s");
}

/// Waits until `/ready` answers 200 (the model loaded, the start-up adapters settled).
pub fn wait_ready(s: &Server) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(120) {
        if http(s.port, "GET", "/ready", &[], "").0 == 200 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("not ready in 120 s");
}

/// A tenants file in `dir` with one key per `(tenant, key)`, as `--tenants` flags.
pub fn tenants_file(dir: &Path, tenants: &[(&str, &str)]) -> Vec<String> {
    let path = dir.join("tenants.yaml");
    let mut text = String::from("tenants:\n");
    for (id, key) in tenants {
        text.push_str(&format!("- id: {id}\n  apiKeys: [\"{key}\"]\n"));
    }
    std::fs::write(&path, text).unwrap();
    vec!["--tenants".into(), path.display().to_string()]
}

/// A blocking HTTP request with curl-free std networking: returns (status, body).
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    c.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status: u16 = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// An HTTP client for the tests (the ring TLS provider installed, as the server's own is).
pub fn client(timeout: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(timeout).build().unwrap()
}

/// The sum of a series' samples in a Prometheus text page: `series` is a metric name (every label set
/// counts, other metrics that merely start with it do not) or a name and the start of its labels
/// (`name{adapter="a1"`).
pub fn metric_sum(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(series) && (series.contains('{') || l[series.len()..].starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
