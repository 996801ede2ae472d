//! Events on LoraAdapters: one per `Ready` or `Verified` transition a user acts on, and the outcome of
//! an unload on deletion. Publishing is best effort: a failed Event never fails a reconcile.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::runtime::events::Recorder;
use modelfleet_crds::LoraAdapter;
use modelfleet_crds::condition_types::{READY, VERIFIED};

/// An Event to publish: (warning?, reason, note).
pub type Note = (bool, String, String);

fn find<'a>(cs: &'a [Condition], t: &str) -> Option<&'a Condition> {
    cs.iter().find(|c| c.type_ == t)
}

/// The Events that the conditions `previous` → `next` deserve.
pub fn transitions(previous: &[Condition], next: &[Condition]) -> Vec<Note> {
    let mut out = Vec::new();
    for t in [VERIFIED, READY] {
        let (Some(new), old) = (find(next, t), find(previous, t)) else {
            continue;
        };
        if old.is_some_and(|o| o.status == new.status && o.reason == new.reason) {
            continue;
        }
        // Work in progress is not news: only verdicts, failures and arrivals are.
        let benign = (t == VERIFIED && new.status == "Unknown")
            || (t == READY && matches!(new.reason.as_str(), "Loading" | "NoReadyReplicas" | "Deleting"));
        if benign {
            continue;
        }
        let warning = new.status == "False";
        out.push((
            warning,
            new.reason.clone(),
            format!("{t}={}: {}", new.status, new.message),
        ));
    }
    out
}

/// Publishes `notes` on `a`.
pub async fn publish(recorder: &Recorder, a: &LoraAdapter, notes: Vec<Note>) {
    crate::controller::events::publish(recorder, &a.object_ref(&()), notes).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn c(t: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn events_on_verdicts_failures_and_arrivals_only() {
        let loading = [c(VERIFIED, "Unknown", "Pending"), c(READY, "False", "Loading")];
        let loaded = [c(VERIFIED, "True", "Verified"), c(READY, "True", "Loaded")];
        let mismatch = [
            c(VERIFIED, "False", "DigestMismatch"),
            c(READY, "False", "DigestMismatch"),
        ];
        let failed = [c(VERIFIED, "True", "Verified"), c(READY, "False", "LoadFailed")];
        let reasons = |p: &[Condition], n: &[Condition]| -> Vec<(bool, String)> {
            transitions(p, n).into_iter().map(|(w, r, _)| (w, r)).collect()
        };
        assert_eq!(reasons(&[], &loading), []);
        assert_eq!(
            reasons(&loading, &loaded),
            [(false, "Verified".to_string()), (false, "Loaded".to_string())]
        );
        assert_eq!(reasons(&loaded, &loaded), []);
        assert_eq!(
            reasons(&[], &mismatch),
            [
                (true, "DigestMismatch".to_string()),
                (true, "DigestMismatch".to_string())
            ]
        );
        assert_eq!(reasons(&loaded, &failed), [(true, "LoadFailed".to_string())]);
        assert_eq!(reasons(&failed, &loaded), [(false, "Loaded".to_string())]);
    }
}
