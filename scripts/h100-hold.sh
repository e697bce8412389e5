#!/usr/bin/env bash
# One GPU-machine hold (device tool, <= 30 min): the full-profile sm_90 flash-attn wheel built by attnforge's
# cell builder over the machine's torch, the parity suite on it, the wheel published to a static index and
# served, and `attnforge runner check` with the smoke run installing from that index. Meanwhile: the
# toolchain probe (scripts/toolchain-probe.py).
#
#   bash scripts/h100-hold.sh start          # returns at once; everything runs under setsid
#   bash scripts/h100-hold.sh start-narrow   # the second hold: see run_narrow
#   bash scripts/h100-hold.sh start-final    # the next hold (fits one session's budget): see run_final
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

# The next hold, sized to one session's device budget (1800 s, counted in full). Session 3 learned that the
# full profile (1400-1600 s of build) leaves no room for anything else, and that anything run alongside the
# build slows it. So: (1) the Flex first-call benchmark on the idle machine first (artifacts: Mega-Cache,
# precompiled function, AOTInductor; then the timed fresh processes; about 7 min); (2) the widest profile that
# fits what is left, head dims 64 and 128 by default (FINAL_BUILD_ARGS), built with nothing alongside, then
# flash-attn + transformers parity; (3) the attention benchmark with that wheel if time remains.
FINAL_BUILD_ARGS="${FINAL_BUILD_ARGS:---head-dims 64,128 --tag hd64128 --arches sm_90 --nvcc-threads 1}"
run_final() {
  cd "$ROOT" || exit 5
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
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
  # alongside the build only gpu-validate's phase B (Flex + SDPA parity, about 80 s)
  OUT="$R/gv" bash scripts/gpu-validate.sh --sdist .carry/flash_attn-2.8.3.tar.gz --build "$FINAL_BUILD_ARGS" \
    --skip firstcall --skip flex --out "$R/gv" > "$R/gv.log" 2>&1
  echo "$?" > "$R/gv.rc"
  date -u +%FT%TZ > "$R/done"
}

# Pause (or resume, with CONT) a background build on the GPU machine without matching this shell itself:
# the bracket keeps the pattern from matching its own command line.
pause_build() { pkill "-${1:-STOP}" -f "[/]tmp/attnforge-gpu-validate/build/" ; }

collect() {
  [ -n "${OUT:-}" ] || { echo "collect: \$OUT is not set" >&2; return 2; }
  tail -5 "$R/gv.log" 2>/dev/null
  for f in "$R"/*.rc; do [ -f "$f" ] && echo "$(basename "$f"): $(cat "$f")"; done
  tail -3 "$R/parity-narrow.log" "$R/flex-first-call.log" "$R/flex-wheel.log" 2>/dev/null
  ls "$R" 2>/dev/null
  tar -czf "$OUT/h100-hold.tar.gz" -C "$(dirname "$R")" "$(basename "$R")" \
    -C /tmp/attnforge-gpu-validate logs 2>/dev/null
  cp "$R"/gv/parity.json "$R"/gv/parity.md "$R"/gv/parity.junit.xml "$R"/runner_check.json \
    "$R"/toolchain_probe.json "$R"/flex_first_call.json "$R"/flex_wheel_first_call.json "$OUT/" 2>/dev/null
  cp "$R"/gv/attention_h100.* "$OUT/" 2>/dev/null
  [ -d "$R/parity-narrow" ] && cp "$R"/parity-narrow/parity.json "$OUT/parity-narrow.json" 2>/dev/null
  return 0
}

case "${1:-}" in
  start) mkdir -p "$R"; setsid nohup bash "$0" run > "$R/hold.log" 2>&1 < /dev/null & echo "started (pid $!)";;
  start-final) mkdir -p "$R"; setsid nohup bash "$0" run-final > "$R/hold.log" 2>&1 < /dev/null & echo "started (pid $!)";;
  start-narrow) mkdir -p "$R"; setsid nohup bash "$0" run-narrow > "$R/hold.log" 2>&1 < /dev/null & echo "started (pid $!)";;
  run) run_all;;
  run-narrow) run_narrow;;
  run-final) run_final;;
  pause-build) pause_build STOP;;
  resume-build) pause_build CONT;;
  collect) collect;;
  *) echo "usage: $0 start|start-narrow|start-final|collect|pause-build|resume-build" >&2; exit 2;;
esac
