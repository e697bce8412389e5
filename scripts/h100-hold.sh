#!/usr/bin/env bash
# One GPU-machine hold (device tool, <= 30 min): the full-profile sm_90 flash-attn wheel built by attnforge's
# cell builder over the machine's torch, the parity suite on it, the wheel published to a static index and
# served, and `attnforge runner check` with the smoke run installing from that index. Meanwhile: the
# toolchain probe (scripts/toolchain-probe.py).
#
#   bash scripts/h100-hold.sh start          # returns at once; everything runs under setsid
#   bash scripts/h100-hold.sh start-narrow   # the second hold: see run_narrow
#   bash scripts/h100-hold.sh start-flex     # the next hold (Flex first call, nothing alongside): run_flex
#   bash scripts/h100-hold.sh collect        # copy what exists so far into $OUT (call it from every poll)
#
# Needs in the repository root: .carry/flash_attn-2.8.3.tar.gz (the sdist) and .whl/ (pydantic and its
# dependencies for the machine's Python, which lacks them). Results land in $RESULTS (default /tmp/h100).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
R="${RESULTS:-/tmp/h100}"
PY="${PYTHON:-python3}"
BUILD_ARGS="${BUILD_ARGS:---arches sm_90 --nvcc-threads 1}"
GV_ARGS="${GV_ARGS:---skip firstcall --skip bench --flex-args --no-aoti}"
export PYTHONPATH="/tmp/site:$ROOT/src" PYTHONUNBUFFERED=1

# publish WHEEL to a static index, serve it, and run `attnforge runner check` with the smoke run installing
# from that index (from the wheel file when publish refused it)
publish_and_check() {
  local wheel="$1"
  "$PY" -m attnforge.cli publish "$wheel" --to /tmp/h100-index > "$R/publish.log" 2>&1
  echo "$?" > "$R/publish.rc"
  "$PY" -m attnforge.cli serve /tmp/h100-index --port 8765 > "$R/serve.log" 2>&1 &
  local serve_pid=$!
  sleep 3
  local variant
  variant="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['variant'])" "$wheel.manifest.json")"
  local smoke=(--smoke-index "http://127.0.0.1:8765/$variant/simple")
  [ "$(cat "$R/publish.rc")" = 0 ] || smoke=(--smoke-wheel "$wheel")
  "$PY" -m attnforge.cli runner check --matrix matrix.yaml --target gpu-runner "${smoke[@]}" \
    --json "$R/runner_check.json" > "$R/runner_check.txt" 2>&1
  echo "$?" > "$R/runner_check.rc"
  kill "$serve_pid" 2>/dev/null
}

run_all() {
  cd "$ROOT" || exit 5
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
  ( "$PY" scripts/toolchain-probe.py --aoti --out "$R/toolchain_probe.json" > "$R/probe.log" 2>&1 ) &
  # shellcheck disable=SC2086
  OUT="$R/gv" bash scripts/gpu-validate.sh --sdist .carry/flash_attn-2.8.3.tar.gz --build "$BUILD_ARGS" \
    $GV_ARGS --out "$R/gv" > "$R/gv.log" 2>&1
  echo "$?" > "$R/gv.rc"
  local wheel
  wheel="$(ls /tmp/attnforge-gpu-validate/dist/flash_attn-*.whl 2>/dev/null | head -1)"
  if [ -n "$wheel" ]; then
    cp "$wheel.manifest.json" "$R/" 2>/dev/null
    publish_and_check "$wheel"
  fi
  wait
  date -u +%FT%TZ > "$R/done"
}

# The second hold: a narrow-profile wheel (head dim 64, bf16) built with the builder's compiler check on,
# finalized, parity-tested (its excluded head dims and fp16 must raise, not crash), published to a static
# index, served, and installed from there by `runner check`'s smoke run; then the Flex first-call benchmark
# (cold vs Mega-Cache vs AOTInductor) on the otherwise idle machine.
run_narrow() {
  cd "$ROOT" || exit 5
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
  local work=/tmp/attnforge-narrow dist=/tmp/attnforge-narrow/dist fin=/tmp/attnforge-narrow/final
  env | grep -E '^(CC|CXX)=' > "$R/compiler-env.txt"
  "$PY" -m attnforge.parity.devbuild --sdist .carry/flash_attn-2.8.3.tar.gz --out "$dist" --work "$work/build" \
    --head-dims 64 --dtypes bf16 --arches sm_90 --nvcc-threads 1 --tag hd64bf16 > "$R/build.log" 2>&1
  echo "$?" > "$R/build.rc"
  local raw wheel
  raw="$(ls "$dist"/flash_attn-*.whl 2>/dev/null | head -1)"
  if [ -n "$raw" ]; then
    "$PY" -m attnforge.cli wheels finalize "$raw" --out-dir "$fin" > "$R/finalize.log" 2>&1
    echo "$?" > "$R/finalize.rc"
    wheel="$(ls "$fin"/flash_attn-*.whl 2>/dev/null | head -1)"
    [ -n "$wheel" ] || { wheel="$raw"; mkdir -p "$fin"; }
    local vpy
    vpy="$("$PY" -m attnforge.parity.venv "$work/venv" "$wheel" 2>"$R/venv.log" | tail -1)"
    "$vpy" -m attnforge.parity.runner --out "$R/parity-narrow" --suites flash,hf --matrix matrix.yaml \
      --wheel "$(basename "$wheel")" --manifest "$wheel.manifest.json" --record \
      --report-path reports/gpu/parity-narrow.json > "$R/parity-narrow.log" 2>&1
    echo "$?" > "$R/parity.rc"
    cp "$wheel.manifest.json" "$R/"
    publish_and_check "$wheel"
  fi
  "$PY" benchmarks/flex_first_call.py --device cuda --out "$R/flex_first_call.json" --work /tmp/fc \
    > "$R/flex-first-call.log" 2>&1
  echo "$?" > "$R/firstcall.rc"
  cp /tmp/fc/build-manifests.json "$R/flex-first-call-builds.json" 2>/dev/null
  date -u +%FT%TZ > "$R/done"
}

# The Flex hold, nothing alongside (sessions 4-5): (0) bytecode for the machine's torch, (1) the artifacts
# (Mega-Cache, precompiled function, AOTInductor: fwd variants one package, fwd+bwd variants a forward and a
# backward package; about 8 min), (2) the timed fresh processes (cold vs Mega-Cache vs precompiled vs
# AOTInductor), (3) the attnforge-flex-kernels wheel's first call in a fresh venv (fwd+bwd variants, then fwd
# ones), (4) one profiled first call per path of the document fwd+bwd variant (where a cached first call's
# time goes), (5) the timing again with TORCHINDUCTOR_COMPILE_THREADS=1. About 25 min; each step's result is
# kept as it lands.
run_flex() {
  cd "$ROOT" || exit 5
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
  # the machine's torch venv ships no bytecode (and sets PYTHONDONTWRITEBYTECODE=1): every fresh process would
  # compile torch's sources (6 s per Flex first call, session 5); a pip-installed torch has its .pyc files
  "$PY" -m compileall -q -j 16 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    > "$R/compileall.log" 2>&1
  "$PY" benchmarks/flex_first_call.py --device cuda --build-only --jobs 3 --work /tmp/fc \
    --out "$R/flex_first_call.json" > "$R/fc-build.log" 2>&1
  echo "$?" > "$R/fc-build.rc"
  cp /tmp/fc/build-manifests.json "$R/flex-first-call-builds.json" 2>/dev/null
  "$PY" benchmarks/flex_first_call.py --device cuda --reuse --work /tmp/fc --out "$R/flex_first_call.json" \
    > "$R/flex-first-call.log" 2>&1
  echo "$?" > "$R/firstcall.rc"
  "$PY" benchmarks/flex_wheel_first_call.py --artifacts /tmp/fc/build-bwd/artifacts --work /tmp/fcw \
    --out "$R/flex_wheel_first_call.json" > "$R/flex-wheel.log" 2>&1
  echo "$?" > "$R/flexwheel.rc"
  "$PY" benchmarks/flex_wheel_first_call.py --artifacts /tmp/fc/build/artifacts --work /tmp/fcw-fwd \
    --out "$R/flex_wheel_first_call_fwd.json" > "$R/flex-wheel-fwd.log" 2>&1
  echo "$?" > "$R/flexwheelfwd.rc"
  "$PY" benchmarks/flex_first_call.py --device cuda --reuse --profile "$R/profile" --work /tmp/fc \
    --out /tmp/fc/unused.json > "$R/flex-profile.log" 2>&1
  echo "$?" > "$R/profile.rc"
  "$PY" benchmarks/flex_first_call.py --device cuda --reuse --compile-threads 1 --work /tmp/fc \
    --out "$R/flex_first_call_1t.json" > "$R/flex-first-call-1t.log" 2>&1
  echo "$?" > "$R/firstcall1t.rc"
  date -u +%FT%TZ > "$R/done"
}

collect() {
  [ -n "${OUT:-}" ] || { echo "collect: \$OUT is not set" >&2; return 2; }
  tail -5 "$R/gv.log" 2>/dev/null
  for f in "$R"/*.rc; do [ -f "$f" ] && echo "$(basename "$f"): $(cat "$f")"; done
  tail -3 "$R/parity-narrow.log" "$R/flex-first-call.log" "$R/flex-wheel.log" "$R/flex-wheel-fwd.log" \
    "$R/flex-profile.log" "$R/flex-first-call-1t.log" 2>/dev/null
  ls "$R" 2>/dev/null
  tar -czf "$OUT/h100-hold.tar.gz" -C "$(dirname "$R")" "$(basename "$R")" \
    -C /tmp/attnforge-gpu-validate logs 2>/dev/null
  # at most 8 files come back (the device tool's limit): the tarball holds everything, these are the headlines
  if [ -d "$R/gv" ]; then
    cp "$R"/gv/parity.json "$R"/gv/attention_h100.json "$R"/gv/attention_h100.md "$R"/gv/attention_h100.png \
      "$R"/flex_first_call.json "$R"/flex_wheel_first_call.json "$OUT/" 2>/dev/null
  else
    cp "$R"/flex_first_call.json "$R"/flex_first_call_1t.json "$R"/flex_wheel_first_call.json \
      "$R"/flex_wheel_first_call_fwd.json "$R"/flex-first-call-builds.json "$OUT/" 2>/dev/null
  fi
  return 0
}

case "${1:-}" in
  start) mkdir -p "$R"; setsid nohup bash "$0" run > "$R/hold.log" 2>&1 < /dev/null & echo "started (pid $!)";;
  start-flex) mkdir -p "$R"; setsid nohup bash "$0" run-flex > "$R/hold.log" 2>&1 < /dev/null & echo "started (pid $!)";;
  start-narrow) mkdir -p "$R"; setsid nohup bash "$0" run-narrow > "$R/hold.log" 2>&1 < /dev/null & echo "started (pid $!)";;
  run) run_all;;
  run-narrow) run_narrow;;
  run-flex) run_flex;;
  collect) collect;;
  *) echo "usage: $0 start|start-narrow|start-flex|collect" >&2; exit 2;;
esac
