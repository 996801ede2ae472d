#!/usr/bin/env bash
# The fleet gateway's own cost per request (issue #15): a trivial OpenAI-shaped upstream (a fixed chat
# completion answered at once) on a loopback IP, the real gateway in front of it (router, bounded
# listener, default flags: affinity routing, pod header, one log line per request; one deployment,
# one tenant key), and a closed-loop load generator (tokio + reqwest, one keep-alive HTTP/1.1
# connection per client) straight at the upstream and through the gateway, alternating, PAIRS pairs at
# each client level. Prints a Markdown table per level: p50/p99 both ways, added latency (gateway −
# direct) and requests/s, per pair and as median (range).
#
#   bench/gateway_overhead.sh                       # PAIRS=5 CLIENTS=1,64 PHASE_SECONDS=3
#   STREAM=1 bench/gateway_overhead.sh              # SSE answers (4 events) instead of one JSON body
#   EXTRA="--log-file none" bench/gateway_overhead.sh   # without the gateway's request log
#   EXTRA=--fallback bench/gateway_overhead.sh     # every request moved by spec.fallback (its cost)
#   EXTRA="--traces http://127.0.0.1:4318" bench/gateway_overhead.sh   # every request traced, exported
#                                                   # to that collector (no request log: compare with
#                                                   # EXTRA="--log-file none"; bench/traces.sh starts one)
#
# Client, gateway and upstream share the machine's cores (three tokio runtimes of 2 workers each in
# one process). Runs under `flock /tmp/mf-bench.lock` so two benchmarks never share the cores.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
PAIRS="${PAIRS:-5}" CLIENTS="${CLIENTS:-1,64}" PHASE_SECONDS="${PHASE_SECONDS:-3}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
ARGS=(--pairs "$PAIRS" --clients "$CLIENTS" --seconds "$PHASE_SECONDS")
[[ -n "${STREAM:-}" ]] && ARGS+=(--stream)
# shellcheck disable=SC2206
[[ -n "${EXTRA:-}" ]] && ARGS+=($EXTRA)

cargo build --release --quiet -p modelfleet-gateway --example overhead_bench
echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD)"
flock /tmp/mf-bench.lock "$TARGET/release/examples/overhead_bench" "${ARGS[@]}"
