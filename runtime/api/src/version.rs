//! What `--version` prints for every modelfleet program: the release version and the git revision it
//! was built from. `make dist` (and so `make images`) builds with `MODELFLEET_REVISION` set to the
//! commit; other builds say `unknown`. The images carry the same two values as OCI labels.

/// The git commit the binary was built from (`MODELFLEET_REVISION` at build time), or `unknown`.
pub const REVISION: &str = match option_env!("MODELFLEET_REVISION") {
    Some(r) => r,
    None => "unknown",
};

/// `<version> (revision <commit>)`, for clap's `--version`.
pub fn long() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| format!("{} (revision {REVISION})", env!("CARGO_PKG_VERSION")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_version_and_the_revision() {
        let v = super::long();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        assert!(v.contains("(revision "), "{v}");
    }
}
