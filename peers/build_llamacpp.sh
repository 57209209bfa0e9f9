#!/usr/bin/env bash
# Build llama-perplexity, llama-tokenize and llama-quantize from the llama-cpp-python sdist pinned in peers/llamacpp.txt, once, under
# build/llamacpp (cached: a second call only checks the binary). One line on stderr and exit 2 when
# a tool is missing; nothing half-built is left as the binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/llamacpp"
bin="$out/bin/llama-perplexity"
py="${PYTHON:-$root/.venv/bin/python}"
pin=$(grep -E '^llama-cpp-python==' "$root/peers/llamacpp.txt")
version=${pin#*==}
tokenize="$out/bin/llama-tokenize"  # the ids llama-perplexity scores, for kvlib's side (python -m kvlib.runs.llamacpp)
quantize="$out/bin/llama-quantize"  # the GGUF's weights dequantized to F32 (--engine-weights f32)
if [ -x "$bin" ] && [ -x "$tokenize" ] && [ -x "$quantize" ] && [ "$(cat "$out/VERSION" 2>/dev/null)" = "$version" ]; then echo "$bin"; exit 0; fi
for tool in cmake cc c++; do
  command -v "$tool" >/dev/null || { echo "make peer-llamacpp: $tool not found (needs cmake and a C/C++ compiler: apt-get install cmake g++)" >&2; exit 2; }
done
mkdir -p "$out/src"
sdist="$out/src/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  "$py" -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check -d "$out/src" "$pin" \
    || { echo "make peer-llamacpp: cannot download the $pin sdist from PyPI" >&2; exit 2; }
fi
llama="$out/src/llama_cpp_python-$version/vendor/llama.cpp"
if [ "$(cat "$out/VERSION" 2>/dev/null)" != "$version" ] || [ ! -d "$llama" ]; then  # else: a tool added, built incrementally
  rm -rf "$out/src/llama_cpp_python-$version" "$out/cmake"
  tar -xzf "$sdist" -C "$out/src"
fi
cmake -S "$llama" -B "$out/cmake" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF > "$out/cmake.log" 2>&1 \
  || { echo "make peer-llamacpp: cmake configure failed (see $out/cmake.log)" >&2; exit 2; }
cmake --build "$out/cmake" --target llama-perplexity llama-tokenize llama-quantize -j"$(nproc)" > "$out/build.log" 2>&1 \
  || { echo "make peer-llamacpp: the build failed (see $out/build.log)" >&2; exit 2; }
mkdir -p "$out/bin"
cp "$out/cmake/bin/llama-tokenize" "$tokenize.tmp" && mv "$tokenize.tmp" "$tokenize"
cp "$out/cmake/bin/llama-quantize" "$quantize.tmp" && mv "$quantize.tmp" "$quantize"
cp "$out/cmake/bin/llama-perplexity" "$bin.tmp" && mv "$bin.tmp" "$bin"
echo "$version" > "$out/VERSION"
echo "$bin"
