//! The routes as data (a reader that answers from a table), and the listener over loopback TLS with
//! real certificates: the front proxy's is served; no certificate, another name of the same CA, or
//! the right name from another CA gets no HTTP at all.

use super::*;
use crate::external_metrics::test_pki;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pod(waiting: f64, running: f64, kv: f64) -> PodMetrics {
    PodMetrics { waiting, running, kv }
}

/// A reader answering `result` and remembering what it was asked.
fn reader(result: Result<Vec<PodMetrics>, String>, asked: Arc<Mutex<Vec<(String, String)>>>) -> Reader {
    Arc::new(move |ns, selector| {
        asked.lock().unwrap().push((ns, selector));
        let result = result.clone();
        Box::pin(async move { result })
    })
}

async fn get(r: Reader, name: &str, selector: Option<&str>) -> (StatusCode, Value) {
    let query = selector
        .map(|s| HashMap::from([("labelSelector".to_string(), s.to_string())]))
        .unwrap_or_default();
    let (code, Json(body)) = metric(State(r), Path(("serving".into(), name.into())), Query(query)).await;
    (code, body)
}

/// (pods read, metric, selector) → (code, value or the message's words).
type Case = (
    Result<Vec<PodMetrics>, String>,
    &'static str,
    Option<&'static str>,
    StatusCode,
    &'static str,
);

#[tokio::test]
async fn a_metric_is_read_fresh_from_the_deployments_ready_pods_or_refused_with_why() {
    let selector = Some("modelfleet.io/model-deployment=chat");
    let two = Ok(vec![pod(3.0, 1.0, 0.5), pod(2.0, 1.0, 0.25)]);
    let cases: [Case; 7] = [
        (
            two.clone(),
            "modelfleet_requests_waiting",
            selector,
            StatusCode::OK,
            "5",
        ),
        (
            two.clone(),
            "modelfleet_requests_running",
            selector,
            StatusCode::OK,
            "2",
        ),
        (
            two.clone(),
            "modelfleet_kv_cache_usage_ratio",
            selector,
            StatusCode::OK,
            "375m",
        ),
        (
            two.clone(),
            "cpu",
            selector,
            StatusCode::NOT_FOUND,
            "served: modelfleet_requests_waiting",
        ),
        (
            two.clone(),
            "modelfleet_requests_waiting",
            None,
            StatusCode::BAD_REQUEST,
            "must name the ModelDeployment",
        ),
        (
            Ok(vec![]),
            "modelfleet_requests_waiting",
            selector,
            StatusCode::SERVICE_UNAVAILABLE,
            "no Ready replica",
        ),
        (
            Err("pod 10.0.0.1: connection refused".into()),
            "modelfleet_requests_waiting",
            selector,
            StatusCode::SERVICE_UNAVAILABLE,
            "connection refused",
        ),
    ];
    for (pods, name, selector, code, says) in cases {
        let asked = Arc::default();
        let (got, body) = get(reader(pods, Arc::clone(&asked)), name, selector).await;
        assert_eq!(got, code, "{name} {selector:?}: {body}");
        if code == StatusCode::OK {
            assert_eq!(body["items"][0]["value"], says, "{name}");
            assert_eq!(body["items"][0]["metricName"], name);
            let asked = asked.lock().unwrap().clone();
            let pods = "app.kubernetes.io/name=modelfleet-runtime,modelfleet.io/model-deployment=chat";
            assert_eq!(asked, [("serving".to_string(), pods.to_string())]);
        } else {
            assert_eq!(body["kind"], "Status");
            assert_eq!(body["code"], code.as_u16());
            let message = body["message"].as_str().unwrap();
            assert!(message.contains(says), "{name}: {message}");
        }
    }
}

/// The PKI, and a listener serving the routes with it (the front proxy named `front-proxy-client`).
async fn listening() -> (test_pki::Pki, std::net::SocketAddr) {
    let pki = test_pki::make();
    let proxy = FrontProxy {
        client_ca: String::from_utf8(pki.read("proxy-ca.crt")).unwrap(),
        allowed_names: vec!["front-proxy-client".into()],
    };
    let config =
        super::super::tls::server_config(&pki.read("server.crt"), &pki.read("server.key"), &proxy).unwrap();
    let tls: Tls = Arc::new(RwLock::new(Some((Arc::new(config), proxy))));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = reader(Ok(vec![pod(4.0, 1.0, 0.5)]), Arc::default());
    tokio::spawn(serve(listener, tls, router(r)));
    (pki, addr)
}

/// GET `path` over TLS as client `who` (none: no certificate): the response, or why there is none.
async fn fetch(
    pki: &test_pki::Pki,
    addr: std::net::SocketAddr,
    who: Option<&str>,
    path: &str,
) -> Result<String, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&pki.read("serving-ca.crt")).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match who {
        Some(name) => {
            let chain = vec![CertificateDer::from_pem_slice(&pki.read(&format!("{name}.crt"))).unwrap()];
            let key = PrivateKeyDer::from_pem_slice(&pki.read(&format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let host = ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(host, tcp).await.map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    if response.is_empty() {
        return Err("closed without a response".into());
    }
    Ok(String::from_utf8_lossy(&response).into_owned())
}

#[tokio::test]
async fn only_the_front_proxy_is_served() {
    let (pki, addr) = listening().await;
    let path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/serving/modelfleet_requests_waiting\
                ?labelSelector=modelfleet.io%2Fmodel-deployment%3Dchat";
    let ok = fetch(&pki, addr, Some("front-proxy-client"), path)
        .await
        .expect("served");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("\"value\":\"4\""), "{ok}");
    let discovery = fetch(
        &pki,
        addr,
        Some("front-proxy-client"),
        "/apis/external.metrics.k8s.io/v1beta1",
    )
    .await
    .unwrap();
    assert!(
        discovery.contains("\"groupVersion\":\"external.metrics.k8s.io/v1beta1\""),
        "{discovery}"
    );
    let elsewhere = fetch(&pki, addr, Some("front-proxy-client"), "/api/v1/secrets")
        .await
        .unwrap();
    assert!(elsewhere.starts_with("HTTP/1.1 404"), "{elsewhere}");
    for who in [None, Some("intruder"), Some("stranger")] {
        let refused = fetch(&pki, addr, who, path).await;
        assert!(refused.is_err(), "{who:?} was served: {refused:?}");
    }
}
