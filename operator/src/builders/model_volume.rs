//! How the model reaches a runtime pod, by `spec.model`'s source and delivery (pure, table-tested):
//! - fetched (`file`, `http(s)`, `hf`, `oci` with `delivery: Fetch`, `s3`): an emptyDir the fetch init
//!   container fills and verifies (through the node cache in opted-in namespaces), mounted read-only
//!   into the runtime;
//! - an image volume (`oci` with `delivery: ImageVolume`): the node pulls the model image (once per
//!   node) and mounts its `/models` read-only; the fetch container only checks it (`--mounted`: the
//!   signature, when required, and the digest);
//! - a claim (`pvc://claim/path`): mounted read-only at `path`; checked the same way, nothing copied.
//!
//! Invariants: credentials (the `credentialsSecretRef` Secret) and the public key are mounted into the
//! fetch container only, never the runtime; an image volume is pinned by manifest digest; every model
//! volume is read-only in the runtime container; the model is at [`MODEL_DIR`] whatever its source.

use super::deployment::MODEL_DIR;
use k8s_openapi::api::core::v1::{
    ImageVolumeSource, KeyToPath, LocalObjectReference, PersistentVolumeClaimVolumeSource,
    SecretVolumeSource, Volume, VolumeMount,
};
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::model_deployment::Delivery;

/// Where the source's credentials are mounted in the fetch container.
pub const CREDENTIALS_DIR: &str = "/etc/modelfleet/source-credentials";
/// Where the signature's public key is mounted in the fetch container.
pub const PUBLIC_KEY_DIR: &str = "/etc/modelfleet/model-key";
/// The file name of the public key there.
pub const PUBLIC_KEY_FILE: &str = "cosign.pub";
/// Where a model image keeps the model (KServe's modelcar layout; `package --format image` writes it).
pub const IMAGE_MODEL_SUBPATH: &str = "models";

/// How `spec.model` is delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Fetched into an emptyDir by the fetch container.
    Fetched,
    /// An image volume of `reference` (`registry/repo@sha256:…`).
    Image { reference: String },
    /// A claim, at `path` on it.
    Claim { claim: String, path: String },
}

/// The plan for `md`'s model.
pub fn plan(md: &ModelDeployment) -> Plan {
    let m = &md.spec.model;
    if let Some(rest) = m.uri.strip_prefix("pvc://") {
        let (claim, path) = rest.split_once('/').unwrap_or((rest, ""));
        return Plan::Claim {
            claim: claim.to_string(),
            path: path.trim_end_matches('/').to_string(),
        };
    }
    if m.delivery == Some(Delivery::ImageVolume)
        && let Some(rest) = m.uri.strip_prefix("oci://")
    {
        // `registry/repo[:tag]@digest` → `registry/repo@digest`: the digest is what the node pulls.
        let (name, digest) = rest.split_once('@').unwrap_or((rest, ""));
        let last_slash = name.rfind('/').unwrap_or(0);
        let repo = match name[last_slash..].find(':') {
            Some(colon) => &name[..last_slash + colon],
            None => name,
        };
        return Plan::Image {
            reference: format!("{repo}@{digest}"),
        };
    }
    Plan::Fetched
}

/// The model volume (the emptyDir of a fetched model is made by the caller, with its size limit).
pub fn model_volume(plan: &Plan) -> Option<Volume> {
    match plan {
        Plan::Fetched => None,
        Plan::Image { reference } => Some(Volume {
            name: "model".into(),
            image: Some(ImageVolumeSource {
                reference: Some(reference.clone()),
                pull_policy: Some("IfNotPresent".into()),
            }),
            ..Default::default()
        }),
        Plan::Claim { claim, .. } => Some(Volume {
            name: "model".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        }),
    }
}

/// The model's mount at [`MODEL_DIR`] (read-only; the fetch container of a fetched model writes it).
pub fn model_mount(plan: &Plan, writable: bool) -> VolumeMount {
    let sub_path = match plan {
        Plan::Fetched => None,
        Plan::Image { .. } => Some(IMAGE_MODEL_SUBPATH.to_string()),
        Plan::Claim { path, .. } => (!path.is_empty()).then(|| path.clone()),
    };
    VolumeMount {
        name: "model".into(),
        mount_path: MODEL_DIR.into(),
        read_only: Some(!(writable && *plan == Plan::Fetched)),
        sub_path,
        ..Default::default()
    }
}

/// The Secrets the fetch container mounts (credentials, public key) as volumes.
pub fn secret_volumes(md: &ModelDeployment) -> Vec<Volume> {
    let m = &md.spec.model;
    let mut out = Vec::new();
    if let Some(c) = &m.credentials_secret_ref {
        out.push(Volume {
            name: "model-credentials".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(c.name.clone()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if let Some(v) = &m.verify {
        out.push(Volume {
            name: "model-key".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(v.public_key_secret_ref.name.clone()),
                default_mode: Some(0o444),
                items: Some(vec![KeyToPath {
                    key: v.public_key_secret_ref.key.clone(),
                    path: PUBLIC_KEY_FILE.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    out
}

/// The fetch container's mounts of those Secrets.
pub fn secret_mounts(md: &ModelDeployment) -> Vec<VolumeMount> {
    let m = &md.spec.model;
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..Default::default()
    };
    let mut out = Vec::new();
    if m.credentials_secret_ref.is_some() {
        out.push(mount("model-credentials", CREDENTIALS_DIR));
    }
    if m.verify.is_some() {
        out.push(mount("model-key", PUBLIC_KEY_DIR));
    }
    out
}

/// The fetch flags `spec.model` adds: where the model is (or goes), credentials, key, settings.
pub fn fetch_flags(md: &ModelDeployment, plan: &Plan) -> Vec<String> {
    let m = &md.spec.model;
    let mut args = vec![
        "--uri".to_string(),
        m.uri.clone(),
        "--digest".into(),
        m.digest.clone(),
        match plan {
            Plan::Fetched => "--dest",
            _ => "--mounted",
        }
        .into(),
        MODEL_DIR.into(),
        // The operator polls it while the pod starts (status.starting).
        "--progress-addr".into(),
        format!("$(POD_IP):{}", crate::labels::ADMIN_PORT),
    ];
    if m.credentials_secret_ref.is_some() {
        args.extend(["--credentials-dir".into(), CREDENTIALS_DIR.into()]);
    }
    if m.verify.is_some() {
        args.extend([
            "--public-key".into(),
            format!("{PUBLIC_KEY_DIR}/{PUBLIC_KEY_FILE}"),
        ]);
    }
    if m.oci.as_ref().is_some_and(|o| o.plain_http) {
        args.push("--plain-http".into());
    }
    if let Some(s3) = &m.s3 {
        if let Some(e) = &s3.endpoint {
            args.extend(["--s3-endpoint".into(), e.clone()]);
        }
        if let Some(r) = &s3.region {
            args.extend(["--s3-region".into(), r.clone()]);
        }
        if s3.force_path_style {
            args.push("--s3-path-style".into());
        }
    }
    args
}

/// The image volume's pull secret (the credentials Secret), for the pod's `imagePullSecrets`.
pub fn pull_secrets(md: &ModelDeployment, plan: &Plan) -> Vec<LocalObjectReference> {
    match (plan, &md.spec.model.credentials_secret_ref) {
        (Plan::Image { .. }, Some(c)) => vec![LocalObjectReference { name: c.name.clone() }],
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(uri: &str, delivery: Option<Delivery>) -> ModelDeployment {
        let mut md: ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "modelfleet.io/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"model": {"uri": uri, "digest": format!("sha256:{}", "a".repeat(64))}}
        }))
        .unwrap();
        md.spec.model.delivery = delivery;
        md
    }

    #[test]
    fn plans_by_source_and_delivery() {
        let d = format!("sha256:{}", "b".repeat(64));
        let check = |uri: &str, delivery, want: Plan| assert_eq!(plan(&md(uri, delivery)), want, "{uri}");
        check("hf://org/m@main", None, Plan::Fetched);
        check(&format!("oci://reg:5000/models/m:v1@{d}"), None, Plan::Fetched);
        check(
            &format!("oci://reg:5000/models/m:v1@{d}"),
            Some(Delivery::ImageVolume),
            Plan::Image {
                reference: format!("reg:5000/models/m@{d}"),
            },
        );
        check(
            &format!("oci://reg:5000/m@{d}"),
            Some(Delivery::ImageVolume),
            Plan::Image {
                reference: format!("reg:5000/m@{d}"),
            },
        );
        check(
            "pvc://models/smollm2/",
            None,
            Plan::Claim {
                claim: "models".into(),
                path: "smollm2".into(),
            },
        );
        check(
            "pvc://models",
            None,
            Plan::Claim {
                claim: "models".into(),
                path: String::new(),
            },
        );
    }

    #[test]
    fn mounts_are_read_only_except_a_fetched_models_for_its_fetch() {
        let image = Plan::Image {
            reference: "r/m@x".into(),
        };
        assert_eq!(model_mount(&image, true).read_only, Some(true));
        assert_eq!(model_mount(&image, true).sub_path.as_deref(), Some("models"));
        assert_eq!(model_mount(&Plan::Fetched, true).read_only, Some(false));
        assert_eq!(model_mount(&Plan::Fetched, false).read_only, Some(true));
        let claim = Plan::Claim {
            claim: "c".into(),
            path: String::new(),
        };
        assert_eq!(model_mount(&claim, false).sub_path, None);
        assert!(fetch_flags(&md("pvc://c", None), &claim).contains(&"--mounted".to_string()));
    }
}
