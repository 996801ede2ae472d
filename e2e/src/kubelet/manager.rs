//! The pod manager: watches the pods bound to this node and keeps exactly one worker per pod UID.
//!
//! Invariants: a pod UID has at most one worker, and a finished worker is never restarted for the
//! same UID; a pod that disappears from the API (a Delete event, or absent from a re-list) is
//! told `Gone`; on shutdown every worker is cancelled and awaited, so no process outlives the
//! kubelet.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::context::Ctx;
use super::pod::{self, PodUpdate};

struct Worker {
    updates: watch::Sender<PodUpdate>,
    task: JoinHandle<()>,
}

/// Runs until `shutdown`; then stops every pod and returns.
pub async fn run(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let selector = format!("spec.nodeName={}", ctx.config.node_name);
    let stream = watcher(api, watcher::Config::default().fields(&selector)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut workers: HashMap<String, Worker> = HashMap::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut listed: Option<HashSet<String>> = None;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let workers_cancel = CancellationToken::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(uid) = done_rx.recv() => {
                workers.remove(&uid);
                finished.insert(uid);
            }
            event = stream.next() => match event {
                None => break,
                Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                Some(Ok(watcher::Event::Init)) => listed = Some(HashSet::new()),
                Some(Ok(watcher::Event::InitApply(pod))) => {
                    if let Some(listed) = listed.as_mut() {
                        listed.insert(uid_of(&pod));
                    }
                    upsert(&ctx, &mut workers, &finished, &done_tx, &workers_cancel, pod);
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    let listed = listed.take().unwrap_or_default();
                    for (uid, worker) in &workers {
                        if !listed.contains(uid) {
                            let _ = worker.updates.send(PodUpdate::Gone);
                        }
                    }
                    finished.retain(|uid| listed.contains(uid));
                }
                Some(Ok(watcher::Event::Apply(pod))) => {
                    upsert(&ctx, &mut workers, &finished, &done_tx, &workers_cancel, pod);
                }
                Some(Ok(watcher::Event::Delete(pod))) => {
                    let uid = uid_of(&pod);
                    if let Some(worker) = workers.get(&uid) {
                        let _ = worker.updates.send(PodUpdate::Gone);
                    }
                    finished.remove(&uid);
                }
            }
        }
    }
    tracing::info!(pods = workers.len(), "stopping all pods");
    workers_cancel.cancel();
    for (_, worker) in workers {
        let _ = worker.task.await;
    }
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Hands the latest object to the pod's worker, starting one for a new UID.
fn upsert(
    ctx: &Arc<Ctx>,
    workers: &mut HashMap<String, Worker>,
    finished: &HashSet<String>,
    done: &mpsc::UnboundedSender<String>,
    cancel: &CancellationToken,
    pod: Pod,
) {
    let uid = uid_of(&pod);
    if uid.is_empty() || finished.contains(&uid) {
        return;
    }
    let pod = Arc::new(pod);
    if let Some(worker) = workers.get(&uid) {
        let _ = worker.updates.send(PodUpdate::Present(pod));
        return;
    }
    let (tx, rx) = watch::channel(PodUpdate::Present(pod.clone()));
    let (ctx, done, cancel, key) = (ctx.clone(), done.clone(), cancel.child_token(), uid.clone());
    tracing::info!(
        namespace = pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod = pod.metadata.name.as_deref().unwrap_or_default(),
        uid = %uid,
        "starting pod worker"
    );
    let task = tokio::spawn(async move {
        pod::run(ctx, pod, rx, cancel).await;
        let _ = done.send(key);
    });
    workers.insert(uid, Worker { updates: tx, task });
}
