#!/usr/bin/env bash
# Builds llama.cpp's `llama-server`, `llama-bench`, `llama-quantize` and `llama-perplexity` (CPU only) from the llama.cpp
# source tree that the `llama-cpp-python` sdist on PyPI vendors, plus the shared library libllama
# that bench/llamacpp/reference.py drives through ctypes.
#
#   bench/llamacpp/build.sh            # prints the build directory on its last line
#
# The sdist is fetched with `pip download --no-deps --no-binary llama-cpp-python` (only that package from
# source; its build backend comes as wheels), as the issue prescribes.
# Cache: $MODELFLEET_LLAMACPP_CACHE (default ~/.cache/modelfleet/llamacpp/<version>). Skips the
# download and the build when the binaries are already there. About 5 minutes on 2 cores.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${MODELFLEET_LLAMACPP_CACHE:-$HOME/.cache/modelfleet/llamacpp/$VERSION}"
JOBS="${JOBS:-$(nproc)}"
SRC="$CACHE/src"
BUILD="$CACHE/build-cpu"  # not "build": the GGML_NATIVE builds of earlier versions of this script

if [[ -x "$BUILD/bin/llama-server" && -x "$BUILD/bin/llama-bench" && -x "$BUILD/bin/llama-quantize" \
      && -x "$BUILD/bin/llama-perplexity" \
      && -n "$(ls "$BUILD"/bin/libllama.so* 2>/dev/null)" ]]; then
  echo "llama.cpp (llama-cpp-python $VERSION) already built" >&2
  echo "$BUILD"
  exit 0
fi

mkdir -p "$CACHE"
if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
  echo "downloading the llama-cpp-python==$VERSION sdist" >&2
  python3 -m pip download --no-deps --no-binary llama-cpp-python --dest "$CACHE/sdist" "llama-cpp-python==$VERSION" >&2
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar -xzf "$CACHE"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$SRC" --strip-components=1
fi
LLAMA="$SRC/vendor/llama.cpp"
test -f "$LLAMA/CMakeLists.txt" || { echo "no vendor/llama.cpp in the sdist" >&2; exit 1; }

# cmake: Debian 12's 3.25 satisfies llama.cpp's cmake_minimum_required; fall back to PyPI's otherwise.
CMAKE=cmake
need="$(sed -n 's/^cmake_minimum_required(VERSION \([0-9.]*\).*/\1/p' "$LLAMA/CMakeLists.txt" | head -1)"
have="$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p' || true)"
if [[ -z "$have" || "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]]; then
  python3 -m venv "$CACHE/cmake-venv" >&2
  "$CACHE/cmake-venv/bin/pip" install -q cmake >&2
  CMAKE="$CACHE/cmake-venv/bin/cmake"
fi

# Option names as spelled in that tree's CMakeLists (LLAMA_BUILD_UI only exists in newer trees).
opts=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF
      -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON)

# The CPU extensions named one by one from /proc/cpuinfo, not GGML_NATIVE: on hosts with AMX flags a
# native build crashed (SIGSEGV) on q8_0 and ran f16 slower, because the process may not get AMX tile
# permission (arch_prctl(ARCH_REQ_XCOMP_PERM)); AMX stays off. Every other extension the CPU has is on,
# so the peer runs at its best here. Each option is set only where this tree defines it.
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { [[ "$flags" == *" $1 "* ]]; }
ggml_opt() { # option cpu-flag...: ON when the CPU has every flag, else OFF
  local opt=$1; shift
  grep -q "option($opt " "$LLAMA/ggml/CMakeLists.txt" 2>/dev/null || return 0
  local v=ON f
  for f in "$@"; do has "$f" || v=OFF; done
  opts+=("-D$opt=$v")
}
opts+=(-DGGML_NATIVE=OFF)
ggml_opt GGML_SSE42 sse4_2
ggml_opt GGML_AVX avx
ggml_opt GGML_AVX2 avx2
ggml_opt GGML_BMI2 bmi2
ggml_opt GGML_FMA fma
ggml_opt GGML_F16C f16c
ggml_opt GGML_AVX_VNNI avx_vnni
ggml_opt GGML_AVX512 avx512f avx512bw avx512dq avx512vl avx512cd
ggml_opt GGML_AVX512_VBMI avx512vbmi
ggml_opt GGML_AVX512_VNNI avx512_vnni
ggml_opt GGML_AVX512_BF16 avx512_bf16
for amx in GGML_AMX_TILE GGML_AMX_INT8 GGML_AMX_BF16; do
  grep -q "option($amx " "$LLAMA/ggml/CMakeLists.txt" 2>/dev/null && opts+=("-D$amx=OFF")
done
echo "llama.cpp CPU options: ${opts[*]}" >&2
grep -q 'LLAMA_CURL' "$LLAMA/CMakeLists.txt" && opts+=(-DLLAMA_CURL=OFF)
grep -q 'LLAMA_BUILD_UI' "$LLAMA/CMakeLists.txt" && opts+=(-DLLAMA_BUILD_UI=OFF)
grep -q 'GGML_OPENMP' "$LLAMA/ggml/CMakeLists.txt" 2>/dev/null && opts+=(-DGGML_OPENMP=ON)

"$CMAKE" -S "$LLAMA" -B "$BUILD" "${opts[@]}" >&2
"$CMAKE" --build "$BUILD" -j "$JOBS" --target llama-server llama-bench llama-quantize llama-perplexity llama >&2
# libllama / libggml land next to the binaries in current trees; copy them there otherwise.
find "$BUILD" -name 'lib*.so*' -not -path "$BUILD/bin/*" -exec cp -P {} "$BUILD/bin/" \; 2>/dev/null || true
echo "$BUILD"
