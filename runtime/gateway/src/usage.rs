//! `modelfleet-gateway usage`: the hourly usage records of the limits store as CSV, for billing jobs
//! (docs/gateway.md, "Usage records"). Run it where the gateway runs (`kubectl exec deploy/<release>-
//! modelfleet-gateway -- modelfleet-gateway usage --hour 2026-12-05T13`): it reads the same
//! `MODELFLEET_GATEWAY_LIMITS_STORE`.

use crate::limits::store::Store;
use clap::Args;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The CSV columns, in order.
pub const COLUMNS: [&str; 10] = [
    "hour",
    "namespace",
    "model_deployment",
    "tenant",
    "model",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_micros",
];

/// `modelfleet-gateway usage`.
#[derive(Args, Clone, Debug)]
pub struct UsageArgs {
    /// The limits store (as `run`'s `--limits-store`).
    #[arg(long, env = "MODELFLEET_GATEWAY_LIMITS_STORE")]
    pub limits_store: String,
    /// UTC hours to print, `YYYY-MM-DDTHH` (repeatable).
    #[arg(long = "hour")]
    pub hours: Vec<String>,
    /// Without `--hour`: the last N hours, the current one included.
    #[arg(long, default_value_t = 1)]
    pub last: u32,
}

/// The last `n` UTC hours, oldest first, the current one last.
fn last_hours(n: u32) -> Vec<String> {
    let now = jiff::Timestamp::now();
    (0..n.clamp(1, 24 * 35))
        .rev()
        .filter_map(|k| now.checked_sub(jiff::SignedDuration::from_hours(k as i64)).ok())
        .map(|t| {
            t.to_zoned(jiff::tz::TimeZone::UTC)
                .strftime("%Y-%m-%dT%H")
                .to_string()
        })
        .collect()
}

fn valid_hour(h: &str) -> bool {
    jiff::civil::DateTime::strptime("%Y-%m-%dT%H", h).is_ok()
}

/// One hour's record as CSV rows (no header), sorted by row.
pub fn rows(hour: &str, record: &HashMap<String, u64>) -> Vec<String> {
    let mut by_row: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for (field, v) in record {
        if let Some((row, counter)) = field.rsplit_once('|') {
            by_row.entry(row).or_default().insert(counter, *v);
        }
    }
    by_row
        .into_iter()
        .filter_map(|(row, counters)| {
            let parts: Vec<&str> = row.splitn(4, '/').collect();
            if parts.len() != 4 {
                return None;
            }
            let mut cells: Vec<String> = std::iter::once(hour.to_string())
                .chain(parts.iter().map(|p| p.to_string()))
                .collect();
            for c in &COLUMNS[5..] {
                cells.push(counters.get(c).copied().unwrap_or(0).to_string());
            }
            Some(cells.join(","))
        })
        .collect()
}

/// Prints the hours' records as CSV.
pub async fn run(args: UsageArgs) -> anyhow::Result<()> {
    let hours = if args.hours.is_empty() {
        last_hours(args.last)
    } else {
        args.hours
    };
    if let Some(bad) = hours.iter().find(|h| !valid_hour(h)) {
        anyhow::bail!("--hour {bad:?}: expected YYYY-MM-DDTHH (UTC), e.g. 2026-12-05T13");
    }
    let store = Store::redis(&args.limits_store, Duration::from_secs(5)).map_err(anyhow::Error::msg)?;
    println!("{}", COLUMNS.join(","));
    for h in hours {
        let record = store.usage(&h).await.map_err(anyhow::Error::msg)?;
        for r in rows(&h, &record) {
            println!("{r}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_become_csv_rows() {
        let record: HashMap<String, u64> = [
            ("ns/chat/team-a/llama|requests", 3),
            ("ns/chat/team-a/llama|completion_tokens", 40),
            ("ns/chat/team-a/llama|cost_micros", 1700),
            ("ns/chat/team-b/sql|requests", 1),
            ("garbage", 9),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            rows("2026-12-05T13", &record),
            [
                "2026-12-05T13,ns,chat,team-a,llama,3,0,0,40,1700",
                "2026-12-05T13,ns,chat,team-b,sql,1,0,0,0,0"
            ]
        );
        assert!(valid_hour("2026-12-05T13") && !valid_hour("2026-12-05") && !valid_hour("x"));
        let last = last_hours(3);
        assert_eq!(last.len(), 3);
        assert_eq!(last[2], crate::limits::hour_now());
        assert!(last.iter().all(|h| valid_hour(h)) && last[0] < last[1]);
    }
}
