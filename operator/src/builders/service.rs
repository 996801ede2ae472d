//! The runtime `Service`: a stable name for the fleet's HTTP API. (In the e2e harness nothing routes
//! through ClusterIPs — clients watch Pods — but real clusters and gateways use it.)

use super::owned_meta;
use crate::labels::{HTTP_PORT, selector_labels, workload_name};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use modelfleet_crds::ModelDeployment;

/// The Service selecting `md`'s runtime pods on their `http` port.
pub fn desired_service(md: &ModelDeployment) -> Service {
    let name = md.metadata.name.clone().unwrap_or_default();
    Service {
        metadata: owned_meta(md, workload_name(&name)),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(&name)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: HTTP_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
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
    fn selects_the_runtime_pods() {
        let s = desired_service(&minimal());
        let spec = s.spec.unwrap();
        assert_eq!(spec.selector.unwrap(), selector_labels("smollm2"));
        assert_eq!(spec.ports.unwrap()[0].port, 8000);
    }
}
