//! Core Events about pods (Scheduled, Pulled, Created, Started, Killing, BackOff, Unhealthy, Failed).
//!
//! Invariant: publishing never blocks or fails the caller: each event is sent from its own task,
//! and errors are only logged. Repeated events are folded into a series by kube's `Recorder`.

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes events as the kubelet of one node.
#[derive(Clone)]
pub struct EventSink {
    recorder: Recorder,
}

impl EventSink {
    /// Events reported by `kubelet` on `node`.
    pub fn new(client: Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "kubelet".into(),
            instance: Some(node.to_string()),
        };
        EventSink {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// A Normal event about `pod`.
    pub fn normal(&self, pod: &Pod, reason: &str, note: String) {
        self.publish(pod, EventType::Normal, reason, note);
    }

    /// A Warning event about `pod`.
    pub fn warning(&self, pod: &Pod, reason: &str, note: String) {
        self.publish(pod, EventType::Warning, reason, note);
    }

    fn publish(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let reference = pod.object_ref(&());
        let recorder = self.recorder.clone();
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, reason = %event.reason, "could not publish an event");
            }
        });
    }
}
