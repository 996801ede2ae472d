//! Certificates for the provider's tests, made by the openssl command line (as the runtime's https
//! tests make theirs): the front proxy's CA and its client certificate, a client of the same CA with
//! another name, a client of another CA, and the serving certificate for `localhost`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where each file is.
pub struct Pki {
    pub dir: tempfile::TempDir,
}

impl Pki {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl on PATH (make setup installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ca(dir: &Path, name: &str) {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn leaf(dir: &Path, name: &str, cn: &str, ca: &str, ext: &str) {
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&extfile),
        format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n{ext}\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/O=system:masters/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &extfile,
            "-out",
            &crt,
        ],
    );
}

/// proxy-ca, front-proxy-client (allowed), intruder (same CA, another name), other-ca + stranger
/// (another CA, the allowed name), serving-ca + server (`localhost`).
pub fn make() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let client = "extendedKeyUsage=clientAuth";
    ca(d, "proxy-ca");
    leaf(d, "front-proxy-client", "front-proxy-client", "proxy-ca", client);
    leaf(d, "intruder", "intruder", "proxy-ca", client);
    ca(d, "other-ca");
    leaf(d, "stranger", "front-proxy-client", "other-ca", client);
    ca(d, "serving-ca");
    leaf(
        d,
        "server",
        "modelfleet-operator",
        "serving-ca",
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost",
    );
    Pki { dir }
}
