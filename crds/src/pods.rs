//! The one reading of a pod's readiness that the operator, the gateway and the end-to-end tests share:
//! Kubernetes' `Ready` condition, whether the pod is being deleted, and its IP. (Pods are not this
//! crate's API, but this is the crate every Kubernetes-facing part of modelfleet depends on.)

use k8s_openapi::api::core::v1::Pod;

/// Whether the pod's `Ready` condition is `True`, whatever else is going on.
pub fn ready_condition(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the pod is Ready and not being deleted.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && ready_condition(pod)
}

/// The IP to send the pod requests at, when it may take them: Ready, not being deleted, with an IP.
pub fn routable_ip(pod: &Pod) -> Option<&str> {
    let ip = pod
        .status
        .as_ref()?
        .pod_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())?;
    is_ready(pod).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(ready: &str, ip: Option<&str>, deleting: bool) -> Pod {
        let mut p = Pod {
            status: Some(PodStatus {
                pod_ip: ip.map(String::from),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        p
    }

    #[test]
    fn readiness_deletion_and_ip() {
        let cases = [
            (pod("True", Some("10.0.0.1"), false), true, true, Some("10.0.0.1")),
            (pod("True", Some("10.0.0.1"), true), true, false, None),
            (pod("False", Some("10.0.0.1"), false), false, false, None),
            (pod("True", Some(""), false), true, true, None),
            (pod("True", None, false), true, true, None),
            (Pod::default(), false, false, None),
        ];
        for (p, condition, ready, ip) in cases {
            assert_eq!(
                (ready_condition(&p), is_ready(&p), routable_ip(&p)),
                (condition, ready, ip),
                "{:?}",
                p.status
            );
        }
    }
}
