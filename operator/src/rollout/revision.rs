//! A revision: the first 10 hex digits of the SHA-256 of the runtime pods' template as JSON (keys in
//! a fixed order, the revision label itself left out). Everything that changes the pods — model,
//! digest, runtime settings, the operator's image and flags — changes it; the replica count does not.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use sha2::{Digest, Sha256};

pub use modelfleet_crds::rollout::REVISION_LABEL;

/// The revision of a pod template.
pub fn of(template: &PodTemplateSpec) -> String {
    let mut t = template.clone();
    if let Some(meta) = t.metadata.as_mut() {
        if let Some(labels) = meta.labels.as_mut() {
            labels.remove(REVISION_LABEL);
            if labels.is_empty() {
                meta.labels = None;
            }
        }
        if *meta == Default::default() {
            t.metadata = None;
        }
    }
    // serde_json's Value keeps object keys sorted, so equal templates hash equally.
    let value = serde_json::to_value(&t).expect("a pod template serialises");
    let hash = Sha256::digest(value.to_string().as_bytes());
    hash.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn template(image: &str, revision_label: Option<&str>) -> PodTemplateSpec {
        let mut labels = std::collections::BTreeMap::from([("app".to_string(), "x".to_string())]);
        if let Some(r) = revision_label {
            labels.insert(REVISION_LABEL.into(), r.into());
        }
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "runtime".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_same_template_is_the_same_revision_and_a_change_is_another() {
        let a = of(&template("img@sha256:1", None));
        assert_eq!(a.len(), 10);
        assert_eq!(a, of(&template("img@sha256:1", Some("whatever"))));
        assert_ne!(a, of(&template("img@sha256:2", None)));
    }
}
