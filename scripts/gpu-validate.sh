#!/usr/bin/env bash
# GPU validation of a flash-attn wheel and of the FlexAttention builder, on one GPU machine.
#
#   scripts/gpu-validate.sh --wheel dist/flash_attn-...whl [--manifest dist/...whl.manifest.json]
#   scripts/gpu-validate.sh --sdist flash_attn-2.8.3.tar.gz --build "--head-dims 128 --dtypes bf16 --tag hd128bf16"
#   scripts/gpu-validate.sh --no-flash                # Flex, SDPA and benchmarks only
#
# Phase A: with --build, the wheel is built by attnforge's cell builder (attnforge.parity.devbuild, over the
#          machine's torch) in the background, at lower CPU priority.
# Phase B: meanwhile, the work that needs no flash-attn: Flex first-call benchmark (fresh processes, empty
#          caches), Flex build of the default CUDA variants into the attnforge-flex-kernels wheel, Flex and
#          SDPA parity.
# Phase C: the wheel goes into a fresh venv over the machine's torch (--system-site-packages + a .pth);
#          flash-attn and transformers parity (merged with phase B's results, parity recorded in the wheel's
#          manifest), then the attention benchmark.
# $OUT (default reports/gpu-validate) gets at most 8 files (the device tool's limit):
#   parity.json parity.md parity.junit.xml attention_h100.json attention_h100.png attention_h100.md
#   flex_first_call.json gpu-validate-extras.tar.gz (logs, the manifest with parity, the Flex build
#   manifest and wheel, and with --bring-wheel the flash-attn wheel when the tarball stays under 15.9 MB)
# Options: --out DIR, --quick (one head dim per dtype, bf16-only Flex parity), --skip STEP (parity, bench,
# flex, firstcall, flash), --flex-args "ARGS" (to attnforge.flex.cli_main build, e.g. "--no-aoti"),
# --parity-args "ARGS" (to attnforge.parity.runner), --max-jobs N (build), --bring-wheel,
# --wait-pid PID --wheel-glob 'GLOB': a build started elsewhere (e.g. `attnforge build ... &`) runs during
# phase B; phase C waits for PID to exit, then tests the first wheel matching GLOB (manifest beside it).
# Exit status: 0 when every step ran and parity passed, else the first failing step's status.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/reports/gpu-validate}"
PY="${PYTHON:-python3}"
WHEEL="" MANIFEST="" BUILD="" SDIST="" QUICK="" BRING_WHEEL="" SKIP="" FLEX_ARGS="" PARITY_ARGS="" MAX_JOBS="" WAIT_PID="" WHEEL_GLOB=""
WORK="${WORK:-/tmp/attnforge-gpu-validate}"
STEP_TIMEOUT="${STEP_TIMEOUT:-900}"  # seconds per phase-B step
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) WHEEL="$2"; shift 2;;
    --manifest) MANIFEST="$2"; shift 2;;
    --build) BUILD="$2"; shift 2;;
    --sdist) SDIST="$2"; shift 2;;
    --out) OUT="$2"; shift 2;;
    --quick) QUICK="--quick"; shift;;
    --no-flash) SKIP="$SKIP flash"; shift;;
    --skip) SKIP="$SKIP $2"; shift 2;;
    --bring-wheel) BRING_WHEEL=1; shift;;
    --flex-args) FLEX_ARGS="$2"; shift 2;;
    --parity-args) PARITY_ARGS="$2"; shift 2;;
    --max-jobs) MAX_JOBS="$2"; shift 2;;
    --wait-pid) WAIT_PID="$2"; shift 2;;
    --wheel-glob) WHEEL_GLOB="$2"; shift 2;;
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#'; exit 0;;
    *) echo "gpu-validate: unknown argument $1" >&2; exit 2;;
  esac
done
skipped() { case " $SKIP " in *" $1 "*) return 0;; *) return 1;; esac; }

mkdir -p "$OUT" "$WORK/logs"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STATUS=0
T0=$(date +%s)
note() { echo "== gpu-validate [$(( $(date +%s) - T0 ))s]: $*"; }
fail() { note "FAILED: $1 (exit $2)"; [ "$STATUS" -eq 0 ] && STATUS=$2; }
# run a step in the background and wait: a TERM (e.g. from an outer `timeout`) then reaches the trap at once
CHILD=""
step() { "$@" & CHILD=$!; wait "$CHILD"; local rc=$?; CHILD=""; return $rc; }

"$PY" - <<'PYEOF' 2>&1 | tee "$WORK/logs/env.txt"
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
from importlib.metadata import version
for m in ("triton", "transformers", "matplotlib", "pydantic", "click", "flash_attn"):
    try:
        print(m, version(m))
    except Exception as e:
        print(m, "missing:", type(e).__name__)
PYEOF

# ---- extras: one tarball (the device tool brings back 8 files at most); also on SIGTERM (a timeout)
finish() {
  trap - EXIT TERM INT
  note "done; status $STATUS"
  echo "$STATUS" > "$WORK/logs/status.txt"
  X="$WORK/extras"; rm -rf "$X"; mkdir -p "$X"
  cp -r "$WORK/logs" "$X/"
  [ -n "$MANIFEST" ] && [ -f "$MANIFEST" ] && cp "$MANIFEST" "$X/"
  cp "$WORK/flex/artifacts/manifest.json" "$X/flex-build-manifest.json" 2>/dev/null
  cp "$WORK/firstcall/build-manifests.json" "$X/flex-first-call-builds.json" 2>/dev/null
  cp "$WORK"/flex/dist/*.whl "$X/" 2>/dev/null
  [ -f "$WORK/parity-b.json" ] && cp "$WORK/parity-b.json" "$X/"
  if [ -n "$BRING_WHEEL" ] && [ -n "$WHEEL" ] && [ -f "$WHEEL" ]; then cp "$WHEEL" "$WHEEL.manifest.json" "$X/" 2>/dev/null; fi
  tar -czf "$OUT/gpu-validate-extras.tar.gz" -C "$WORK" extras
  if [ "$(stat -c %s "$OUT/gpu-validate-extras.tar.gz")" -gt 15900000 ] && [ -n "$BRING_WHEEL" ] && [ -n "$WHEEL" ]; then
    rm -f "$X/$(basename "$WHEEL")"; tar -czf "$OUT/gpu-validate-extras.tar.gz" -C "$WORK" extras
    note "the wheel made the extras tarball too large for the device tool: left out"
  fi
  ls -la "$OUT"
  [ -n "$CHILD" ] && kill "$CHILD" 2>/dev/null
  [ -n "$BUILD_PID" ] && kill "$BUILD_PID" 2>/dev/null
  exit "$STATUS"
}
trap 'fail interrupted 124; finish' TERM INT
trap finish EXIT

# ---- phase A: build in the background
BUILD_PID=""
if [ -n "$BUILD" ] && ! skipped flash; then
  [ -n "$SDIST" ] || { echo "gpu-validate: --build needs --sdist" >&2; exit 2; }
  note "phase A: building flash-attn in the background: $BUILD"
  # shellcheck disable=SC2086
  ( nice -n 19 "$PY" -m attnforge.parity.devbuild --sdist "$SDIST" --out "$WORK/dist" --work "$WORK/build" \
      ${MAX_JOBS:+--max-jobs $MAX_JOBS} $BUILD > "$WORK/logs/build.log" 2>&1; echo $? > "$WORK/build.rc" ) &
  BUILD_PID=$!
fi

# ---- phase B: what needs no flash-attn (cheapest and most important first; each step bounded)
PARITY_B=""
if ! skipped parity; then
  note "phase B: Flex + SDPA parity"
  # shellcheck disable=SC2086
  step timeout "$STEP_TIMEOUT" "$PY" -m attnforge.parity.runner --out "$WORK/parity-b" --suites flex,sdpa \
    --save-results "$WORK/parity-b.json" $QUICK $PARITY_ARGS > "$WORK/logs/parity-b.log" 2>&1; rc=$?
  grep -vE "^skip " "$WORK/logs/parity-b.log" | tail -15
  if [ -f "$WORK/parity-b.json" ]; then PARITY_B="$WORK/parity-b.json"; cp "$WORK"/parity-b/parity.* "$OUT/"; fi
  [ "$rc" -eq 0 ] || [ "$rc" -eq 6 ] || fail parity-flex-sdpa "$rc"
fi
if ! skipped flex; then
  note "phase B: flex build (default CUDA variants) + wheel"
  # shellcheck disable=SC2086
  step timeout "$STEP_TIMEOUT" "$PY" -m attnforge.flex.cli_main build --defaults --device cuda --out "$WORK/flex" \
    --wheel-dir "$WORK/flex/dist" $FLEX_ARGS > "$WORK/logs/flex-build.log" 2>&1; rc=$?
  grep -E "^flex|built" "$WORK/logs/flex-build.log"; [ "$rc" -eq 0 ] || fail flex-build "$rc"
fi
if ! skipped firstcall; then
  note "phase B: flex first-call benchmark${BUILD_PID:+ (the build runs niced meanwhile)}"
  step timeout "$STEP_TIMEOUT" "$PY" "$ROOT/benchmarks/flex_first_call.py" --device cuda --out "$OUT/flex_first_call.json" \
    --work "$WORK/firstcall" > "$WORK/logs/flex-first-call.log" 2>&1; rc=$?
  grep -E '^\{"mask"|best_speedup' "$WORK/logs/flex-first-call.log"; [ "$rc" -eq 0 ] || fail flex-first-call "$rc"
fi

# ---- phase C: flash-attn
if [ -n "$BUILD_PID" ]; then
  note "phase C: waiting for the build"
  wait "$BUILD_PID"; rc=$(cat "$WORK/build.rc" 2>/dev/null || echo 4)
  grep -E "^devbuild|attnforge: error" "$WORK/logs/build.log" | tail -5
  [ "$rc" -eq 0 ] || fail build "$rc"
  WHEEL="$(ls "$WORK"/dist/flash_attn-*.whl 2>/dev/null | head -1)"
fi
if [ -n "$WAIT_PID" ]; then
  note "phase C: waiting for the external build (pid $WAIT_PID)"
  while kill -0 "$WAIT_PID" 2>/dev/null; do sleep 5; done
fi
if [ -z "$WHEEL" ] && [ -n "$WHEEL_GLOB" ]; then
  # the newest wheel matching the glob (its manifest beside it is not a wheel)
  for w in $WHEEL_GLOB; do
    case "$w" in *.manifest.json) continue;; esac
    [ -f "$w" ] && { [ -z "$WHEEL" ] || [ "$w" -nt "$WHEEL" ]; } && WHEEL="$w"
  done
  [ -n "$WHEEL" ] || fail "no wheel matches $WHEEL_GLOB" 4
fi
if [ -n "$WHEEL" ] && [ -z "$MANIFEST" ] && [ -f "$WHEEL.manifest.json" ]; then MANIFEST="$WHEEL.manifest.json"; fi
VPY="$PY"
if [ -n "$WHEEL" ] && ! skipped flash; then
  note "phase C: installing $(basename "$WHEEL") into a fresh venv"
  VPY="$("$PY" -m attnforge.parity.venv "$WORK/venv" "$WHEEL" 2>"$WORK/logs/venv.log" | tail -1)" || { fail venv 5; VPY="$PY"; }
  "$VPY" -c "import flash_attn, flash_attn_2_cuda; print('flash_attn', flash_attn.__version__)" || fail import 6
  if ! skipped parity; then
    note "phase C: flash-attn + transformers parity"
    MARGS=(); [ -n "$MANIFEST" ] && MARGS=(--manifest "$MANIFEST" --record --report-path reports/gpu/parity.json)
    LARGS=(); [ -n "$PARITY_B" ] && LARGS=(--load-results "$PARITY_B")
    # shellcheck disable=SC2086
    step "$VPY" -m attnforge.parity.runner --out "$OUT" --suites flash,hf --matrix "$ROOT/matrix.yaml" \
      --wheel "$(basename "$WHEEL")" "${MARGS[@]}" "${LARGS[@]}" $QUICK $PARITY_ARGS > "$WORK/logs/parity-c.log" 2>&1; rc=$?
    grep -vE "^skip " "$WORK/logs/parity-c.log" | tail -25
    [ "$rc" -eq 0 ] || fail parity "$rc"
  fi
elif [ -f "$OUT/parity.json" ] && ! skipped parity; then
  grep -q '"failed": 0' "$OUT/parity.json" || fail parity 6
fi
if ! skipped bench; then
  note "phase C: attention benchmark"
  BARGS=(); [ -n "$MANIFEST" ] && BARGS=(--manifest "$MANIFEST")
  skipped flash && BARGS+=(--no-flash-attn)
  step "$VPY" "$ROOT/benchmarks/attention.py" --out-dir "$OUT" --name attention_h100 "${BARGS[@]}" \
    > "$WORK/logs/attention.log" 2>&1; rc=$?
  grep -E "^\||fa2|benchmark" "$WORK/logs/attention.log" | tail -30; [ "$rc" -eq 0 ] || fail bench "$rc"
fi
