#!/usr/bin/env bash
# Run attnforge's GPU validation on a remote GPU host that has no network and no Docker, driven by short
# commands: each command may start from a fresh copy of the repository, so the long work runs detached in
# the background, is polled with `wait` and its results are packed with `collect`. What the host lacks
# travels in ignored folders of the repository: `.whl/` (attnforge's runtime dependencies as wheels for the
# host's Python) and `.carry/` (kernel source archives, prebuilt kernel objects).
#
#   bash scripts/remote-gpu-run.sh start STEP...   copy the tree to $WORK, install .whl/ into $WORK/site, then
#                                                  run the steps in order in the background (setsid); returns
#                                                  at once
#   bash scripts/remote-gpu-run.sh wait SECONDS    wait until the steps end or SECONDS pass; print where they are
#   bash scripts/remote-gpu-run.sh collect         results into $OUT: reports/ and benchmarks/results/ files, logs
#
# Steps (every step's output: $WORK/logs/<step>.log, exit code $WORK/state/<step>.rc):
#   env-build    nox -s gpu-validate: build against this Python's torch, parity, gated publish, install from
#                the served index ($GPU_RUN_BUILD_ARGS, $ATTNFORGE_PARITY_ARGS); then the FA2 build's schedule
#                against its bound -> benchmarks/results/build_schedule_h100.json (benchmarks/build_schedule.py)
#   cross-torch  kernel objects compiled on another machine against another torch
#                (.carry/objects-$GPU_RUN_CROSS_PROFILE-sm90.tar.gz, default fwd128) bound against this torch:
#                only the binding compiles; the flash-attn parity suite on that wheel -> reports/gpu/cross_torch.json
#   customN      the command line in $GPU_RUN_CUSTOM_N (examples: reports/gpu/README.md, docs/fa3.md)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/af}"
PY="${PYTHON:-python3}"
STATE="$WORK/state"

setup() {
  rm -rf "$WORK" && mkdir -p "$WORK" && cp -a "$ROOT/." "$WORK/"
  mkdir -p "$STATE" "$WORK/logs"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WORK"/.whl/*.whl \
    > "$WORK/logs/pip.log" 2>&1 || return 5
  printf '#!/bin/sh\nexec %s -m attnforge.cli "$@"\n' "$(command -v "$PY")" > "$WORK/site/bin/attnforge"
  chmod +x "$WORK/site/bin/attnforge"
  # a torch installed without bytecode makes every fresh process compile torch's sources: compile them once
  "$PY" -m compileall -q -j 16 "$("$PY" -c 'import site; print(site.getsitepackages()[0])')" > /dev/null 2>&1
  mkdir -p "$WORK/.attnforge-cache/sources"
  cp "$WORK"/.carry/*.tar.gz "$WORK/.attnforge-cache/sources/" 2>/dev/null || true
}

environment() {
  export PYTHONPATH="$WORK/site:$WORK/src" PATH="$WORK/site/bin:$PATH" PYTHONUNBUFFERED=1 CI=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

step_env_build() {
  # shellcheck disable=SC2086
  nox -f noxfile.py -s gpu-validate -- ${GPU_RUN_BUILD_ARGS:---profile hd64128 --arch sm_90}
}

step_schedule() {  # the newest FA2 wheel's unit times against max(sum / cores, longest unit)
  local m
  m="$(ls -t wheels/flash_attn-2*.manifest.json 2>/dev/null | head -1)"
  [ -n "$m" ] && python3 benchmarks/build_schedule.py --manifest "$m" --out benchmarks/results/build_schedule_h100.json
}

step_cross_torch() {
  local profile="${GPU_RUN_CROSS_PROFILE:-fwd128}" key m py rc
  py="$(command -v python3)"
  key="$(python3 scripts/remote_gpu_report.py key "$py" "$profile")" || return 5
  mkdir -p ".attnforge-cache/cells/$key" || return 5
  # the objects may be copied in after the start (cp .carry/objects-*.tar.gz "$WORK/.carry/"): wait up to 10 min
  for _ in $(seq 60); do [ -f ".carry/objects-$profile-sm90.tar.gz" ] && break; sleep 10; done
  tar -xzf ".carry/objects-$profile-sm90.tar.gz" -C ".attnforge-cache/cells/$key" || return 5
  attnforge build --python "$py" --arch sm_90 --profile "$profile" --quiet --force || return $?
  m="$(ls -t wheels/flash_attn-2*."$profile"-*.manifest.json | head -1)"
  attnforge parity run --wheel "${m%.manifest.json}" --suites flash --out reports/gpu/cross-torch
  rc=$?
  python3 scripts/remote_gpu_report.py cross-torch "$m" ".attnforge-cache/cells/$key/objects/manifest.json" "$rc"
  return "$rc"
}

step_custom() {  # GPU_RUN_CUSTOM_<N>: any command line, run in $WORK (steps named custom1, custom2, ...)
  local var="GPU_RUN_CUSTOM_${1#custom}"
  bash -c "${!var}"
}

run_steps() {
  cd "$WORK" || exit 5
  environment
  for name in "$@"; do
    date -u +%FT%TZ > "$STATE/$name.start"
    echo "$name" > "$STATE/current"
    case "$name" in
      env-build) step_env_build && step_schedule ;;
      cross-torch) step_cross_torch ;;
      custom*) step_custom "$name" ;;
      *) echo "remote-gpu-run: unknown step $name" >&2; false ;;
    esac > "$WORK/logs/$name.log" 2>&1
    echo "$?" > "$STATE/$name.rc"
  done
  date -u +%FT%TZ > "$STATE/done"
}

case "${1:-}" in
  start)
    shift
    [ "$#" -gt 0 ] || { echo "remote-gpu-run: name the steps to run" >&2; exit 2; }
    setup || { echo "remote-gpu-run: setup failed (see $WORK/logs/pip.log)" >&2; exit 5; }
    env | grep -E '^GPU_RUN_' > "$STATE/env" || true
    setsid bash -c "$(declare -f environment step_env_build step_schedule step_cross_torch step_custom run_steps); WORK='$WORK' STATE='$STATE' \
      run_steps $*" > "$WORK/logs/run.log" 2>&1 < /dev/null &
    echo "remote-gpu-run: started $* in $WORK (pid $!)"
    ;;
  wait)
    end=$(( $(date +%s) + ${2:-540} ))
    while [ ! -f "$STATE/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 10; done
    for rc in "$STATE"/*.rc; do [ -f "$rc" ] && echo "$(basename "$rc" .rc): exit $(cat "$rc")"; done
    if [ -f "$STATE/done" ]; then echo "remote-gpu-run: done"; else
      cur="$(cat "$STATE/current" 2>/dev/null)"; echo "remote-gpu-run: running $cur"
      tail -n 15 "$WORK/logs/$cur.log" 2>/dev/null
    fi
    ;;
  collect)
    : "${OUT:?collect needs OUT}"
    cd "$WORK" || exit 5
    # one archive, for hosts that return only a few files: logs, step state, reports, benchmark results,
    # wheel manifests
    tar -czf "$OUT/gpu-run.tar.gz" logs state reports/gpu benchmarks/results wheels/*.manifest.json wheels/logs \
      2>/dev/null
    ls -la "$OUT"
    ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
