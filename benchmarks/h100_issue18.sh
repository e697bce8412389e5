#!/bin/bash
# Issue #18's GPU proofs on the H100 machine (16 cores, torch 2.11.0+cu130, nvcc 13.0, Python 3.12, no network).
# Run from the repository root, detached (a step outlives one device call), then poll:
#
#   setsid nohup bash benchmarks/h100_issue18.sh hold-a /tmp/i18 > /tmp/i18.log 2>&1 < /dev/null &
#   sleep 480; bash benchmarks/h100_issue18.sh status /tmp/i18        # repeat until "hold-a: done"
#   cp -r /tmp/i18 $OUT/                                              # what comes back
# Carry: .carry/flash_attn-2.8.3.tar.gz (the sdist) and, for hold-a, .carry/objects-hd128-sm90.tar.gz.
#
# hold-a (about 15 min): (1) cross-torch proof: hd128 kernel objects compiled on another machine against
#   torch 2.14.1 (.carry/objects-hd128-sm90.tar.gz, made by benchmarks/build_sharing.py --keep-objects) are
#   put in this checkout's kernel-objects folder; `attnforge build --python` binds them against this
#   machine's torch 2.11 (only flash_api.cpp compiles) and the parity suite's flash-attn part runs on the
#   wheel; (2) the hd64128 build from scratch, its schedule -> build_schedule_h100.json.
# hold-b (about 23 min): the full profile from scratch, its schedule -> build_schedule_h100.json.
set -u
what=${1:?hold-a, hold-b or status}
out=${2:?an output folder}
mkdir -p "$out"
if [ "$what" != status ]; then  # each device call copies the working tree anew: work from a copy of it
    work=/tmp/attnforge-i18-$what
    rm -rf "$work" && cp -a "$PWD" "$work" && cd "$work" || exit 1
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" CI=1
# no network there: the sdist comes with the carry (sha256 checked by the build)
mkdir -p .attnforge-cache/sources && cp .carry/flash_attn-2.8.3.tar.gz .attnforge-cache/sources/ 2>/dev/null
# hold B may carry hold A's measured unit times (.carry/unit_times.json): the order then follows them
[ -f .carry/unit_times.json ] && cp .carry/unit_times.json .attnforge-cache/unit_times.json
py=$(command -v python3)
af() { python3 -m attnforge.cli "$@"; }
note() { echo "$(date -u +%FT%TZ) $*" | tee -a "$out/steps.txt"; }

newest_manifest() {  # the newest wheel manifest of a profile in wheels/
    python3 - "$1" <<'EOF'
import json, sys
from pathlib import Path
found = [(m.stat().st_mtime, m) for m in Path("wheels").glob("*.manifest.json")
         if json.loads(m.read_text())["inputs"].get("profile") == sys.argv[1]]
print(max(found)[1] if found else "")
EOF
}

schedule() {  # build one profile from scratch (cold kernel objects) and record its schedule
    local profile=$1
    note "build $profile (cold)"
    rm -rf .attnforge-cache/cells
    af build --python "$py" --arch sm_90 --profile "$profile" --quiet --force > "$out/build-$profile.log" 2>&1
    note "build $profile: exit $?"
    local m
    m=$(newest_manifest "$profile")
    [ -n "$m" ] && cp "$m" "$out/" && python3 benchmarks/build_schedule.py --manifest "$m" \
        --out "$out/build_schedule_h100.json" >> "$out/steps.txt" 2>&1
    cp .attnforge-cache/unit_times.json "$out/unit_times-after-$profile.json" 2>/dev/null
}

case $what in
hold-a)
    note "hold-a start"
    python3 -m compileall -q -j 16 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
    # (1) cross-torch: the env cell's kernel-set key must be the one the objects were saved under
    key=$(python3 - <<'EOF'
from pathlib import Path
from attnforge.commands.build import environment_build
from attnforge.project import Project
import shutil
backend, cells = environment_build(Project(Path("matrix.yaml")), shutil.which("python3"), None, [], "hd128", ["sm_90"])
print(cells[0].kernel_set_key)
EOF
)
    note "env cell kernel-set key: $key; carried: $(tar tzf .carry/objects-hd128-sm90.tar.gz | head -1)"
    rm -rf .attnforge-cache/cells && mkdir -p ".attnforge-cache/cells/$key"
    tar xzf .carry/objects-hd128-sm90.tar.gz -C ".attnforge-cache/cells/$key"  # -> objects/
    python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('objects built with', m['built_with'])" \
        ".attnforge-cache/cells/$key/objects/manifest.json" >> "$out/steps.txt"
    note "cross-torch build"
    af build --python "$py" --arch sm_90 --profile hd128 --quiet --force > "$out/cross-build.log" 2>&1
    note "cross-torch build: exit $?"
    m=$(newest_manifest hd128)
    if [ -n "$m" ]; then
        cp "$m" "$out/cross-manifest.json"
        af parity run --wheel "${m%.manifest.json}" --suites flash --out "$out/cross-parity" > "$out/cross-parity.log" 2>&1
        note "cross-torch parity: exit $?"
    fi
    # (2) hd64128 from scratch
    schedule hd64128
    note "hold-a: done"
    ;;
hold-b)
    note "hold-b start"
    schedule full
    note "hold-b: done"
    ;;
status)
    cat "$out/steps.txt" 2>/dev/null
    grep -h "compiled .* units" "$out"/build-*.log 2>/dev/null | tail -2
    ;;
*)
    echo "usage: $0 hold-a|hold-b|status OUT" >&2
    exit 2
    ;;
esac
