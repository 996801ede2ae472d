//! The image map: which local program stands in for which container image.
//!
//! ```yaml
//! images:
//!   modelfleet/runtime:                      # repository; ":tag" and "@digest" are ignored
//!     entrypoint: ["/abs/modelfleet-runtime"] # used when the container has no command (ENTRYPOINT)
//!     binDir: /abs/dir                        # command[0] is looked up here by basename first
//! ```
//!
//! Invariants: matching is on the repository only (a registry host such as `docker.io/` or
//! `127.0.0.1:5000/`, and `library/` after it, are optional); `command[0]` resolves to `binDir/<basename>` if that is an executable file, else to
//! itself if it contains a `/` and is executable, else through the kubelet's `PATH`. The file is
//! re-read when its modification time changes, so tests may add images to a running cluster; a
//! file that stops parsing keeps the previous map.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Deserialize;

use super::error::{Error, Result};

/// What one image maps to.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageEntry {
    /// The program and leading arguments used when the container has no `command`.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// Where a `command[0]` is looked up by basename before the host `PATH`.
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageMapFile {
    #[serde(default)]
    images: BTreeMap<String, ImageEntry>,
}

/// A parsed image map, keyed by repository.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageMap {
    images: BTreeMap<String, ImageEntry>,
}

/// The program a container runs: resolved executable and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Absolute (or `/`-containing) path of the executable.
    pub path: PathBuf,
    /// Arguments after the executable.
    pub args: Vec<String>,
}

impl ImageMap {
    /// Parses the YAML text of an image map.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: ImageMapFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let images = file
            .images
            .into_iter()
            .map(|(k, v)| (repository(&k).to_string(), v))
            .collect();
        Ok(ImageMap { images })
    }

    /// The entry for a container image reference, if the map has its repository.
    pub fn lookup(&self, image: &str) -> Option<&ImageEntry> {
        let repo = repository(image);
        let mut candidates = vec![repo];
        // Any registry host (a first component with a `.` or `:`, or `localhost`): the harness's
        // loopback registry included.
        let unhosted = match repo.split_once('/') {
            Some((host, rest)) if host.contains(['.', ':']) || host == "localhost" => Some(rest),
            _ => None,
        };
        if let Some(rest) = unhosted {
            candidates.push(rest);
            if let Some(rest) = rest.strip_prefix("library/") {
                candidates.push(rest);
            }
        }
        candidates.into_iter().find_map(|c| self.images.get(c))
    }
}

/// The repository part of an image reference: without `@digest` and without `:tag`.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

/// Resolves the program of a container from its image entry, command and args
/// (already rewritten and expanded). `is_executable` is a seam for tests.
pub fn resolve(
    image: &str,
    entry: &ImageEntry,
    command: &[String],
    args: &[String],
    path_env: &str,
    is_executable: &dyn Fn(&Path) -> bool,
) -> Result<Program, String> {
    let argv: Vec<String> = if command.is_empty() {
        if entry.entrypoint.is_empty() {
            return Err(format!(
                "image {image:?} has no entrypoint in the image map and the container has no command"
            ));
        }
        entry.entrypoint.iter().chain(args).cloned().collect()
    } else {
        command.iter().chain(args).cloned().collect()
    };
    let (program, rest) = argv.split_first().ok_or_else(|| "empty command".to_string())?;
    let path = resolve_program(program, entry.bin_dir.as_deref(), path_env, is_executable)?;
    Ok(Program {
        path,
        args: rest.to_vec(),
    })
}

fn resolve_program(
    program: &str,
    bin_dir: Option<&Path>,
    path_env: &str,
    is_executable: &dyn Fn(&Path) -> bool,
) -> Result<PathBuf, String> {
    let basename = Path::new(program).file_name().map(PathBuf::from);
    if let (Some(dir), Some(base)) = (bin_dir, basename) {
        let candidate = dir.join(base);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    if program.contains('/') {
        if is_executable(Path::new(program)) {
            return Ok(PathBuf::from(program));
        }
    } else if let Some(found) = std::env::split_paths(path_env)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
    {
        return Ok(found);
    }
    let where_ = bin_dir
        .map(|d| format!("{} or ", d.display()))
        .unwrap_or_default();
    Err(format!(
        "executable {program:?} not found (looked in {where_}the host PATH)"
    ))
}

/// Whether `path` is a regular file with an execute bit.
pub fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The image map file, re-read when it changes.
#[derive(Debug)]
pub struct ImageSource {
    path: PathBuf,
    cached: Mutex<(Option<SystemTime>, Arc<ImageMap>)>,
}

impl ImageSource {
    /// Loads the file; it must exist and parse.
    pub fn load(path: &Path) -> Result<Self> {
        let (mtime, map) = read(path)?;
        Ok(ImageSource {
            path: path.to_path_buf(),
            cached: Mutex::new((mtime, Arc::new(map))),
        })
    }

    /// The current map, re-read first if the file's modification time changed.
    pub fn current(&self) -> Arc<ImageMap> {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        let mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        if mtime != cached.0 {
            match read(&self.path) {
                Ok((mtime, map)) => *cached = (mtime, Arc::new(map)),
                Err(e) => {
                    tracing::warn!(error = %e, "keeping the previous image map");
                    cached.0 = mtime;
                }
            }
        }
        cached.1.clone()
    }
}

fn read(path: &Path) -> Result<(Option<SystemTime>, ImageMap)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mtime = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let map = ImageMap::parse(&text).map_err(|message| Error::Images {
        path: path.to_path_buf(),
        message,
    })?;
    Ok((mtime, map))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = r#"
images:
  modelfleet/runtime:
    entrypoint: ["/opt/mf/modelfleet-runtime", "serve"]
    binDir: /opt/mf
  modelfleet/testserver:v9:
    entrypoint: ["/opt/mf/mf-testserver"]
  busybox:
    binDir: /opt/bb
"#;

    fn exists(path: &Path) -> bool {
        [
            "/opt/mf/modelfleet-runtime",
            "/opt/mf/mf-testserver",
            "/opt/bb/sh",
            "/usr/bin/cat",
            "/bin/sh",
            "/pod/volumes/bin/tool",
        ]
        .iter()
        .any(|p| Path::new(p) == path)
    }

    fn check(image: &str, command: &[&str], args: &[&str], expected: Result<(&str, &[&str]), &str>) {
        let map = ImageMap::parse(MAP).unwrap();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = match map.lookup(image) {
            None => Err(format!("unknown image {image}")),
            Some(entry) => resolve(
                image,
                entry,
                &strings(command),
                &strings(args),
                "/usr/local/bin:/usr/bin",
                &exists,
            ),
        };
        let expected = expected
            .map(|(path, args)| Program {
                path: PathBuf::from(path),
                args: strings(args),
            })
            .map_err(|e| e.to_string());
        match (&got, &expected) {
            (Err(g), Err(e)) => assert!(g.contains(e.as_str()), "{image}: {g:?} should contain {e:?}"),
            _ => assert_eq!(got, expected, "image {image} command {command:?}"),
        }
    }

    #[test]
    fn repository_ignores_tag_and_digest() {
        for (image, repo) in [
            ("modelfleet/runtime", "modelfleet/runtime"),
            ("modelfleet/runtime:v1", "modelfleet/runtime"),
            ("modelfleet/runtime@sha256:abc", "modelfleet/runtime"),
            ("modelfleet/runtime:v1@sha256:abc", "modelfleet/runtime"),
            (
                "localhost:5000/modelfleet/runtime:v1",
                "localhost:5000/modelfleet/runtime",
            ),
            (
                "localhost:5000/modelfleet/runtime",
                "localhost:5000/modelfleet/runtime",
            ),
        ] {
            assert_eq!(repository(image), repo, "{image}");
        }
    }

    #[test]
    fn programs_resolve_like_entrypoint_and_command() {
        let runtime = "/opt/mf/modelfleet-runtime";
        check(
            "modelfleet/runtime:latest",
            &[],
            &["--port", "8000"],
            Ok((runtime, &["serve", "--port", "8000"])),
        );
        check(
            "docker.io/modelfleet/runtime",
            &[],
            &[],
            Ok((runtime, &["serve"])),
        );
        // Any registry host: the loopback registry's, by digest.
        check(
            "127.0.0.1:5000/modelfleet/runtime@sha256:0123",
            &[],
            &[],
            Ok((runtime, &["serve"])),
        );
        check("ghcr.io/acme/runtime", &[], &[], Err("unknown image"));
        check(
            "modelfleet/runtime",
            &["modelfleet-runtime", "fetch"],
            &["--x"],
            Ok((runtime, &["fetch", "--x"])),
        );
        check(
            "modelfleet/runtime",
            &["/usr/local/bin/modelfleet-runtime"],
            &[],
            Ok((runtime, &[])),
        );
        check(
            "modelfleet/runtime",
            &["cat", "/f"],
            &[],
            Ok(("/usr/bin/cat", &["/f"])),
        );
        check(
            "modelfleet/runtime",
            &["/bin/sh", "-c", "x"],
            &[],
            Ok(("/bin/sh", &["-c", "x"])),
        );
        check(
            "modelfleet/runtime",
            &["/pod/volumes/bin/tool"],
            &[],
            Ok(("/pod/volumes/bin/tool", &[])),
        );
        check(
            "modelfleet/testserver@sha256:00",
            &[],
            &["a"],
            Ok(("/opt/mf/mf-testserver", &["a"])),
        );
        check(
            "busybox:1.36",
            &["sh", "-c", "echo"],
            &[],
            Ok(("/opt/bb/sh", &["-c", "echo"])),
        );
        check(
            "docker.io/library/busybox",
            &["/bin/sh"],
            &[],
            Ok(("/opt/bb/sh", &[])),
        );
        check("busybox", &[], &["x"], Err("has no entrypoint"));
        check(
            "modelfleet/runtime",
            &["nope"],
            &[],
            Err("executable \"nope\" not found"),
        );
        check("modelfleet/runtime", &["/x/nope"], &[], Err("not found"));
        check("ghcr.io/other/image:1", &[], &[], Err("unknown image"));
    }

    #[test]
    fn bad_maps_are_rejected() {
        assert!(ImageMap::parse("images:\n  a:\n    entrypoin: [x]\n").is_err());
        assert!(ImageMap::parse("imagez: {}\n").is_err());
        assert_eq!(ImageMap::parse("images: {}\n").unwrap(), ImageMap::default());
    }
}
