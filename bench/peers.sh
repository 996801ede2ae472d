# Sourced by the side-by-side benchmarks against llama-server (families.sh, long_context.sh): builds the
# peer and our release binary, and waits for a server on $PORT. Sets BUILD (llama.cpp's build directory)
# and SERVER_BIN (ours, unless given). Needs REPO.
BUILD="$(bench/llamacpp/build.sh | tail -1)"
if [[ -z "${SERVER_BIN:-}" ]]; then
  cargo build --release --quiet -p modelfleet-runtime
  SERVER_BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/modelfleet-runtime"
fi

# Waits up to $1 tenths of a second (default 600) for /health on $PORT.
wait_up() {
  for _ in $(seq 1 "${1:-600}"); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not come up" >&2; return 1
}
