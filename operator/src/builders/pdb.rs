//! The runtime `PodDisruptionBudget`: voluntary disruptions (drains, cluster upgrades) take at most one
//! serving pod at a time, and never the last one.

use super::owned_meta;
use crate::labels::{selector_labels, workload_name};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use modelfleet_crds::ModelDeployment;

/// `minAvailable = max(1, replicas - 1)`: one pod may be evicted at a time, and a single-replica fleet is
/// never evicted voluntarily (scale it to two before draining its node).
pub fn desired_pdb(md: &ModelDeployment, replicas: i32) -> PodDisruptionBudget {
    let name = md.metadata.name.clone().unwrap_or_default();
    PodDisruptionBudget {
        metadata: owned_meta(md, workload_name(&name)),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int((replicas - 1).max(1))),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..Default::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::fixtures::minimal;

    #[test]
    fn min_available_by_replicas() {
        for (replicas, expected) in [(1, 1), (2, 1), (3, 2), (10, 9)] {
            let pdb = desired_pdb(&minimal(), replicas);
            assert_eq!(
                pdb.spec.unwrap().min_available,
                Some(IntOrString::Int(expected)),
                "{replicas}"
            );
        }
    }
}
