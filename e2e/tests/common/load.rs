//! A closed-loop load on a deployment's pods: `workers` chat completions always in flight, each sent
//! to a Ready pod of the deployment (found by listing Pods twice a second, round robin), straight to
//! its IP — so the queue the autoscalers read is the one this load builds.

use super::*;
use k8s_openapi::api::core::v1::Pod;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The load, running until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `workers` requests of `max_tokens` each for served name `model`, on the Ready pods of
    /// ModelDeployment `instance`.
    pub fn start(pods: Api<Pod>, instance: &str, model: &str, workers: usize, max_tokens: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let targets: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut tasks = Vec::new();
        {
            let (stop, targets, instance) = (stop.clone(), targets.clone(), instance.to_string());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    *targets.lock().unwrap() = ready_pods(&pods, &instance).await.into_values().collect();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }));
        }
        let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hello fleet"}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true});
        for w in 0..workers {
            let (stop, targets, answered, body) =
                (stop.clone(), targets.clone(), answered.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(60))
                    .build()
                    .unwrap();
                let mut turn = w;
                while !stop.load(Ordering::SeqCst) {
                    let target = {
                        let t = targets.lock().unwrap();
                        (!t.is_empty()).then(|| t[turn % t.len()].clone())
                    };
                    turn += 1;
                    let Some(ip) = target else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    let sent = http
                        .post(format!("http://{ip}:8000/v1/chat/completions"))
                        .json(&body)
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status().is_success() => {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        // 429s and pods going away are expected under load and while scaling.
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }));
        }
        Load {
            stop,
            answered,
            tasks,
        }
    }

    /// Stops every worker; the answers counted.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        self.answered.load(Ordering::Relaxed)
    }
}
