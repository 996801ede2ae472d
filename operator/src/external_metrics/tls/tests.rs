//! The front proxy as data: the ConfigMap's fields → who is admitted; certificates' names read from
//! DER; the TLS configuration built from real PEM files (made by openssl, [`super::super::test_pki`]).

use super::*;
use crate::external_metrics::test_pki;
use std::collections::BTreeMap;

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn der(pem: &[u8]) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem).unwrap().to_vec()
}

/// (the ConfigMap's data, the allowed names or the error's words).
type Case = (
    &'static [(&'static str, &'static str)],
    Result<&'static [&'static str], &'static str>,
);

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

#[test]
fn the_front_proxy_comes_from_the_configmap_or_says_what_is_missing() {
    let cases: [Case; 5] = [
        (&[], Err("has no requestheader-client-ca-file")),
        (
            &[("requestheader-client-ca-file", "  ")],
            Err("aggregation layer"),
        ),
        (&[("requestheader-client-ca-file", CA)], Ok(&[])),
        (
            &[
                ("requestheader-client-ca-file", CA),
                (
                    "requestheader-allowed-names",
                    "[\"front-proxy-client\",\"aggregator\"]",
                ),
            ],
            Ok(&["front-proxy-client", "aggregator"]),
        ),
        (
            &[
                ("requestheader-client-ca-file", CA),
                ("requestheader-allowed-names", "front-proxy-client"),
            ],
            Err("requestheader-allowed-names"),
        ),
    ];
    for (fields, want) in cases {
        let got = FrontProxy::from_data(&data(fields));
        match (got, want) {
            (Ok(p), Ok(names)) => {
                assert_eq!(p.allowed_names, names, "{fields:?}");
                assert_eq!(p.client_ca, CA);
            }
            (Err(e), Err(words)) => assert!(e.contains(words), "{fields:?}: {e}"),
            (got, want) => panic!("{fields:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn names_are_read_from_the_subject_and_only_allowed_ones_pass() {
    let pki = test_pki::make();
    let proxy = der(&pki.read("front-proxy-client.crt"));
    let intruder = der(&pki.read("intruder.crt"));
    // The subject is O=system:masters, CN=…: the name is found past the first attribute.
    assert_eq!(common_name(&proxy).as_deref(), Some("front-proxy-client"));
    assert_eq!(common_name(&intruder).as_deref(), Some("intruder"));
    assert_eq!(
        common_name(&der(&pki.read("proxy-ca.crt"))).as_deref(),
        Some("proxy-ca")
    );
    assert_eq!(common_name(b"not a certificate"), None);
    assert_eq!(common_name(&proxy[..40]), None, "truncated");
    let ca = String::from_utf8(pki.read("proxy-ca.crt")).unwrap();
    let named = FrontProxy {
        client_ca: ca.clone(),
        allowed_names: vec!["front-proxy-client".into()],
    };
    assert!(named.allows(&proxy));
    assert!(!named.allows(&intruder));
    let anyone = FrontProxy {
        client_ca: ca,
        allowed_names: vec![],
    };
    assert!(anyone.allows(&intruder), "no names: any the CA signed");
}

#[test]
fn the_configuration_needs_a_ca_a_certificate_and_its_key() {
    let pki = test_pki::make();
    let proxy = FrontProxy {
        client_ca: String::from_utf8(pki.read("proxy-ca.crt")).unwrap(),
        allowed_names: vec![],
    };
    let (cert, key) = (pki.read("server.crt"), pki.read("server.key"));
    let config = server_config(&cert, &key, &proxy).expect("a configuration");
    assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    let no_ca = FrontProxy {
        client_ca: String::new(),
        allowed_names: vec![],
    };
    let e = server_config(&cert, &key, &no_ca).unwrap_err();
    assert!(e.contains("the front proxy's CA"), "{e}");
    let e = server_config(&cert, &pki.read("intruder.key"), &proxy).unwrap_err();
    assert!(e.contains("the serving certificate and key"), "{e}");
    let e = server_config(&cert, b"no key here", &proxy).unwrap_err();
    assert!(e.contains("the serving key"), "{e}");
}
