#!/usr/bin/env bash
# FlashAttention-4 ahead of time on a GPU host without network, driven by short commands (each may start from
# a fresh copy of the repository; the work runs detached and is polled). What the host lacks travels in
# ignored folders: $FA4_CARRY (attnforge's src/, benchmarks/, scripts/, upstream's tests/cute and the
# declarations) and $FA4_WHEELS (flash-attn-4 and its DSL stack as wheels; a big wheel may come in parts,
# `*.part-*`, some left in /tmp by an earlier command).
#
#   bash scripts/fa4-gpu-run.sh start     copy to $WORK, then in the background: compile torch's bytecode, a venv
#                                         reusing the host's torch, the FA4 stack installed with pip, `worker
#                                         build` (cold compiles -> wheel), pip install of that wheel, the
#                                         throughput run, the first-call benchmark, upstream's tests sampled,
#                                         the stale-cache check
#   bash scripts/fa4-gpu-run.sh wait S    wait up to S seconds; print where the run is
#   bash scripts/fa4-gpu-run.sh collect   the results into $OUT (one archive)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/tmp/fa4}"
CARRY="${FA4_CARRY:-$ROOT/.carry30}"
WHEELS="${FA4_WHEELS:-$ROOT/.whl30}"
PY="${PYTHON:-python3}"

steps() {
  set -x -o pipefail
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  cd "$WORK" || return 5
  local site V
  site="$("$PY" -c 'import site; print(site.getsitepackages()[0])')"
  "$PY" -m compileall -q -j 16 "$site" > /dev/null 2>&1
  "$PY" -m venv "$WORK/venv" || "$PY" -m venv --without-pip "$WORK/venv" || return 5
  V="$WORK/venv/bin/python"
  pip_() { if "$V" -m pip --version > /dev/null 2>&1; then "$V" -m pip "$@"; else "$PY" -m pip --python "$V" "$@"; fi; }
  echo "$site" > "$("$V" -c 'import site; print(site.getsitepackages()[0])')/zz_host_torch.pth"
  pip_ install -q --no-index --no-deps whl/*.whl 2>&1 | tail -5
  pip_ list 2>/dev/null | grep -iE 'flash|cutlass|tvm|quack|dlpack|torch ' | tee out/pip-list.txt
  export PYTHONPATH="$WORK/src"
  "$V" -m attnforge.fa4.worker env | sed -n 's/^@@fa4 //p' > out/env.json
  cat out/env.json
  "$V" -m attnforge.fa4.worker build --decls decls.json --out build --steady 5 2>&1 | tee out/build.log
  cp build/artifacts/manifest.json out/manifest.json
  ls -la build/dist
  pip_ install --no-deps build/dist/*.whl 2>&1 | tail -3; pip_ check 2>&1 | tee out/pip-check.txt  # the meta package always names -libs-cu12, not carried
  # FA3 for the throughput comparison, when its source snapshot came along: built here against this torch
  # (head dims 64 and 128, bf16, backward; every other FLASH_ATTENTION_DISABLE_* switch on)
  local fa3src fa3flag=""
  fa3src="$(ls "$WORK"/flash-attention-3-*.tar.gz 2>/dev/null | head -1)"
  if [ -n "$fa3src" ]; then
    mkdir -p /tmp/fa3 && tar -xzf "$fa3src" -C /tmp/fa3
    (cd /tmp/fa3/flash-attention-3-*/hopper &&
      for x in SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA FP16 FP8 VARLEN CLUSTER HDIM96 HDIM192 HDIM256 SM80 \
        HDIMDIFF64 HDIMDIFF192; do export "FLASH_ATTENTION_DISABLE_$x=TRUE"; done &&
      FLASH_ATTENTION_FORCE_BUILD=TRUE CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=16 NVCC_THREADS=2 \
        "$PY" -m pip wheel --no-build-isolation --no-deps -w /tmp/fa3/dist . > "$WORK/out/fa3-build.log" 2>&1) &&
      pip_ install --no-deps /tmp/fa3/dist/flash_attn_3-*.whl && fa3flag="--fa3"
  fi
  "$V" benchmarks/fa4_speed.py $fa3flag --out out/speed.json > out/speed.log 2>&1
  "$V" benchmarks/fa4_first_call.py --decls decls.json --python "$V" --speed out/speed.json \
    --env out/env.json --out out/fa4_h100.json 2>&1 | tee out/first-call.log
  # a real caller: transformers' flash_attention_4, first training step, cold (FA4 as shipped) then warm
  mkdir -p /tmp/hf-cold /tmp/hf-warm
  ATTNFORGE_FA4=0 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0 TMPDIR=/tmp/hf-cold HOME=/tmp/hf-cold \
    "$V" benchmarks/fa4_hf_client.py > out/hf_client.log 2>&1
  TMPDIR=/tmp/hf-warm HOME=/tmp/hf-warm "$V" benchmarks/fa4_hf_client.py >> out/hf_client.log 2>&1
  # the stale check: FA4's sources changed by one comment -> one warning, a normal compile, right answers
  local cute
  cute="$("$V" -c 'import importlib.util as u; print(u.find_spec("flash_attn.cute").submodule_search_locations[0])')"
  cp "$cute/utils.py" /tmp/fa4-utils.py.orig
  echo "# changed" >> "$cute/utils.py"
  mkdir -p /tmp/stale-tmp
  TMPDIR=/tmp/stale-tmp HOME=/tmp/stale-tmp "$V" -W always -m attnforge.fa4.worker call \
    --decl "$(python3 -c 'import json; print(json.dumps(json.load(open("decls.json"))[0]))')" > out/stale.log 2>&1
  cp /tmp/fa4-utils.py.orig "$cute/utils.py"
  # upstream's own tests for the declared features, sampled
  (cd tests/cute && mv conftest.py upstream_conftest.py && cp "$WORK/src/attnforge/fa4/upstream_plugin.py" conftest.py &&
    ATTNFORGE_FA4_UPSTREAM="$(cat "$WORK/upstream.json")" timeout 420 "$V" -m pytest -q -p no:cacheprovider \
      -o addopts= test_flash_attn.py 2>&1 | tail -40 > "$WORK/out/upstream.log")
  cp /tmp/fa4-upstream.json out/fa4_parity.json 2>/dev/null
}

case "${1:-}" in
  start)
    rm -rf "$WORK" && mkdir -p "$WORK/whl" "$WORK/out" && cp -a "$CARRY/." "$WORK/" || exit 5
    for part in $(ls "$WHEELS"/*.part-* /tmp/*.part-* 2>/dev/null | xargs -n1 basename | sort -u); do
      cat "$WHEELS/$part" 2>/dev/null || cat "/tmp/$part"
    done > "$WORK/whl/joined.tmp"
    name="$(ls "$WHEELS"/*.part-* /tmp/*.part-* 2>/dev/null | head -1 | xargs basename | sed 's/\.part-.*//')"
    [ -s "$WORK/whl/joined.tmp" ] && mv "$WORK/whl/joined.tmp" "$WORK/whl/$name" || rm -f "$WORK/whl/joined.tmp"
    cp "$WHEELS"/*.whl "$WORK/whl/"
    ls -la "$WORK/whl"
    (cd "$WORK/whl" && sha256sum ./*.whl)
    setsid bash -c "$(declare -f steps); WORK='$WORK' PY='$PY' steps; date -u > '$WORK/out/done'" \
      > "$WORK/out/run.log" 2>&1 < /dev/null &
    echo "fa4-gpu-run: started in $WORK"
    ;;
  wait)
    end=$(( $(date +%s) + ${2:-500} ))
    while [ ! -f "$WORK/out/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    [ -f "$WORK/out/done" ] && echo "fa4-gpu-run: done" || echo "fa4-gpu-run: running"
    tail -n 25 "$WORK/out/run.log"
    ;;
  collect)
    : "${OUT:?collect needs OUT}"
    tar -czf "$OUT/fa4-run.tar.gz" -C "$WORK" out build/artifacts/manifest.json build/dist 2>/dev/null
    cp "$WORK"/out/*.json "$OUT/" 2>/dev/null
    ls -la "$OUT"
    ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
