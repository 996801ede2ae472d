//! A real OCI registry for the tests: Debian's `docker-registry` (distribution 2.8, what `make setup`
//! installs and the local cluster runs), started on a free loopback port with its own storage, its
//! access log kept so tests can count the requests a pull made. Killed when dropped.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running registry.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub host: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry (plain HTTP); with `htpasswd`, basic auth against that file's users.
    pub fn start(htpasswd: Option<&str>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let auth = match htpasswd {
            Some(line) => {
                std::fs::write(dir.path().join("htpasswd"), format!("{line}\n")).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                    dir.path().join("htpasswd").display()
                )
            }
            None => String::new(),
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    \
             rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
            dir.path().join("data").display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("docker-registry (make setup installs it)");
        let registry = Registry {
            child,
            host: format!("127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&registry.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not start: {}",
                registry.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// What it logged (the access log among it).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// GETs of the blob `digest` answered 200 or 206 so far (from the access log).
    pub fn blob_reads(&self, digest: &str) -> Vec<String> {
        let needle = format!("/blobs/{digest} ");
        self.log()
            .lines()
            .filter(|l| {
                l.contains("\"GET ")
                    && l.contains(&needle)
                    && (l.contains("\" 200 ") || l.contains("\" 206 "))
            })
            .map(str::to_string)
            .collect()
    }

    /// Its storage directory.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
