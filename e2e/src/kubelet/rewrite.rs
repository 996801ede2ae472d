//! Rewriting of in-container paths to the pod's directories on the host.
//!
//! Processes cannot mount, so the harness rewrites instead: every absolute mount path of a
//! container (and its termination-message path) that appears inside its command, args, literal env
//! values, working dir or exec probes is replaced by the host directory that backs it.
//!
//! Invariants:
//! - A rule matches only at path boundaries: the mount path must start the string or follow a
//!   character that cannot be part of a path (`=`, `:`, space, quote, …, or the `//` of `file://`),
//!   and it must end the string or be followed by `/` or a non-path character. `/models` rewrites
//!   `/models`, `/models/a` and `--dir=/models`, never `/modelsX`, `/models.bak` or `/data/models`.
//! - The longest matching mount path wins, so `/models/cache` beats `/models`.
//! - One left-to-right pass: replaced text is never scanned again, so a host path that happens to
//!   contain a mount path is not rewritten twice.
//! - `/` itself and relative mount paths are never rules (they would rewrite everything).

use std::path::{Path, PathBuf};

/// A set of `mount path → host path` rules for one container.
#[derive(Debug, Clone, Default)]
pub struct PathRewriter {
    /// `(mount path without trailing '/', host path)`, longest mount path first.
    rules: Vec<(String, String)>,
}

impl PathRewriter {
    /// Builds the rules; drops `/` and relative mount paths, normalises trailing slashes.
    pub fn new(rules: impl IntoIterator<Item = (String, PathBuf)>) -> Self {
        let mut rules: Vec<(String, String)> = rules
            .into_iter()
            .filter_map(|(from, to)| {
                let from = from.trim_end_matches('/').to_string();
                if !from.starts_with('/') {
                    return None;
                }
                Some((from, to.to_string_lossy().into_owned()))
            })
            .collect();
        rules.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        rules.dedup_by(|a, b| a.0 == b.0);
        PathRewriter { rules }
    }

    /// The host path for an in-container absolute path, if one rule covers it.
    pub fn host_path(&self, path: &str) -> Option<PathBuf> {
        let rewritten = self.rewrite(path);
        (rewritten != path).then(|| PathBuf::from(rewritten))
    }

    /// Rewrites every mount path found at a path boundary in `input`.
    pub fn rewrite(&self, input: &str) -> String {
        if self.rules.is_empty() {
            return input.to_string();
        }
        let bytes = input.as_bytes();
        let mut out = String::with_capacity(input.len());
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'/' && boundary_before(&bytes[..i]) {
                let hit = self.rules.iter().find(|(from, _)| {
                    bytes[i..].starts_with(from.as_bytes())
                        && bytes
                            .get(i + from.len())
                            .is_none_or(|&c| c == b'/' || !is_path_char(c))
                });
                if let Some((from, to)) = hit {
                    out.push_str(&input[copied..i]);
                    out.push_str(to);
                    i += from.len();
                    copied = i;
                    continue;
                }
            }
            i += 1;
        }
        out.push_str(&input[copied..]);
        out
    }
}

/// Characters that continue a path component (non-ASCII bytes included).
fn is_path_char(c: u8) -> bool {
    c >= 0x80 || c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'~' | b'+' | b'@')
}

/// Whether a mount path may start right after `before`.
fn boundary_before(before: &[u8]) -> bool {
    match before.last() {
        None => true,
        Some(b'/') => before.ends_with(b"file://"),
        Some(&c) => !is_path_char(c),
    }
}

/// Joins a mount's `subPath` onto its volume's host directory, refusing escapes.
pub fn join_sub_path(base: &Path, sub_path: &str) -> Result<PathBuf, String> {
    let sub = Path::new(sub_path);
    if sub.is_absolute()
        || sub
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(format!(
            "subPath {sub_path:?} must be a relative path without '..'"
        ));
    }
    Ok(base.join(sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewriter() -> PathRewriter {
        PathRewriter::new([
            ("/models".to_string(), PathBuf::from("/s/pod/volumes/models")),
            (
                "/models/cache/".to_string(),
                PathBuf::from("/s/pod/volumes/cache"),
            ),
            (
                "/etc/config/app.yaml".to_string(),
                PathBuf::from("/s/pod/volumes/cfg/app.yaml"),
            ),
            (
                "/dev/termination-log".to_string(),
                PathBuf::from("/s/pod/containers/c/termination-log"),
            ),
            ("/".to_string(), PathBuf::from("/nope")),
            ("relative".to_string(), PathBuf::from("/nope")),
            ("/tmp".to_string(), PathBuf::from("/tmp/mf/pods/p/volumes/tmp")),
        ])
    }

    fn check(input: &str, expected: &str) {
        assert_eq!(rewriter().rewrite(input), expected, "input {input:?}");
    }

    #[test]
    fn rewrites_only_at_path_boundaries() {
        check("/models", "/s/pod/volumes/models");
        check("/models/", "/s/pod/volumes/models/");
        check(
            "/models/llama/config.json",
            "/s/pod/volumes/models/llama/config.json",
        );
        check("--model=/models/x", "--model=/s/pod/volumes/models/x");
        check("--model /models", "--model /s/pod/volumes/models");
        check("a:/models:b", "a:/s/pod/volumes/models:b");
        check("\"/models\"", "\"/s/pod/volumes/models\"");
        check("/modelsX", "/modelsX");
        check("/models.bak", "/models.bak");
        check("/models-2/a", "/models-2/a");
        check("/data/models", "/data/models");
        check("x/models", "x/models");
        check("//models", "//models");
        check("file:///models/m", "file:///s/pod/volumes/models/m");
        check("relative", "relative");
        check("/", "/");
        check("/etc/other", "/etc/other");
    }

    #[test]
    fn longest_mount_wins_and_subpaths_are_files() {
        check("/models/cache/k", "/s/pod/volumes/cache/k");
        check("/models/cache", "/s/pod/volumes/cache");
        check("/models/cachex", "/s/pod/volumes/models/cachex");
        check("/etc/config/app.yaml", "/s/pod/volumes/cfg/app.yaml");
        check("/etc/config/app.yamlx", "/etc/config/app.yamlx");
        check("/etc/config", "/etc/config");
    }

    #[test]
    fn several_paths_in_one_string_and_no_double_rewrite() {
        check(
            "cat /etc/config/app.yaml > /dev/termination-log; ls /models",
            "cat /s/pod/volumes/cfg/app.yaml > /s/pod/containers/c/termination-log; ls /s/pod/volumes/models",
        );
        check("/tmp/x", "/tmp/mf/pods/p/volumes/tmp/x");
        check("/tmp", "/tmp/mf/pods/p/volumes/tmp");
        check("é/models", "é/models");
        check("é /models", "é /s/pod/volumes/models");
    }

    #[test]
    fn host_path_and_sub_path() {
        assert_eq!(
            rewriter().host_path("/models/a"),
            Some(PathBuf::from("/s/pod/volumes/models/a"))
        );
        assert_eq!(rewriter().host_path("/srv"), None);
        assert_eq!(join_sub_path(Path::new("/v"), "a/b"), Ok(PathBuf::from("/v/a/b")));
        assert!(join_sub_path(Path::new("/v"), "../x").is_err());
        assert!(join_sub_path(Path::new("/v"), "/x").is_err());
    }
}
