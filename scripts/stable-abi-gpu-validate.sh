#!/usr/bin/env bash
# Validate a stable-ABI FA2 wheel built on another machine, on a GPU host with its own torch (no network):
# gate it (quick parity recorded in its manifest), publish it to the parity-gated static index, serve that index,
# install what `attnforge which` proposes into a fresh venv over the host's torch, then, from that installed copy:
# the parity suites with a sample of upstream's tests/test_flash_attn.py, the stable-ABI wheel tests (dropout,
# CUDA graph, torch.compile, KV cache), a transformers training run against the per-torch wheel of the same
# kernel objects (built here: only its binding compiles), and the speed comparison.
#
#   bash scripts/stable-abi-gpu-validate.sh WHEEL OBJECTS_TGZ UPSTREAM_TESTS OUT NAME
#
# WHEEL: the .whl (its .manifest.json, .provenance.intoto.json and .cdx.json beside it: publish takes only a
# wheel whose build provenance is signed by a trusted key, docs/records.md; give this host the site key the
# build signed with, $ATTNFORGE_SIGNING_KEY, so the parity record it signs here is trusted too); OBJECTS_TGZ: the kernel objects of its kernel set (the
# cell's objects/ folder packed); UPSTREAM_TESTS: flash-attention's tests/test_flash_attn.py of the release
# (a file, checkout or archive); OUT: folder for logs; NAME: stem of the committed results (stable_abi_h100).
# STEPS="a b" runs only those steps. Every step logs to OUT/<step>.log; the script goes on after a failed step and exits non-zero if any failed.
set -uo pipefail
WHEEL="$1" OBJECTS="$2" UPSTREAM="$3" OUT="$4" NAME="${5:-stable_abi_h100}"
PY="$(command -v python3)"
mkdir -p "$OUT"
failed=0
step() {  # step NAME COMMAND...: run, log, remember a failure ($STEPS: run only the steps it names)
  local name="$1"
  shift
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return 0; fi
  echo "== $name: $*" | tee -a "$OUT/steps.log"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/steps.log"
  [ "$rc" -eq 0 ] || failed=1
  return "$rc"
}

per_torch_wheel() {  # the per-torch wheel of the same kernel objects: only flash_api.cpp compiles
  local key
  key="$(python3 scripts/remote_gpu_report.py key "$PY" hd128)" || return 5
  mkdir -p ".attnforge-cache/cells/$key" && tar -xzf "$OBJECTS" -C ".attnforge-cache/cells/$key" || return 5
  attnforge build --python "$PY" --arch sm_90 --profile hd128 --max-jobs 16 --nvcc-threads 1 --quiet
}

serve_and_install() {  # publish (gated), serve, install what `which` proposes into a venv over the host's torch
  attnforge publish --to gpu "$WHEEL" || return $?
  attnforge serve wheels/gpu-index --port 0 > "$OUT/serve.out" 2>&1 &
  echo $! > "$OUT/serve.pid"
  for _ in $(seq 50); do grep -q "^serving" "$OUT/serve.out" && break; sleep 0.2; done
  local url cmd
  url="$(head -1 "$OUT/serve.out" | sed 's/.* at //' | sed 's:/*$::')"
  # a fresh venv that sees the host's torch through a .pth (the host's python3 may itself be a venv, whose
  # packages --system-site-packages would not show)
  python3 -m venv /tmp/stable-venv || return 5
  "$PY" -c 'import site; print(site.getsitepackages()[0])' \
    > "$(/tmp/stable-venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/_host_torch.pth"
  cmd="$(attnforge which --index-url "$url" --python /tmp/stable-venv/bin/python --profile hd128)" || return $?
  echo "which: $cmd"
  # `which` prints `pip install ...`: run it with the venv's pip (no deps: torch is the host's)
  /tmp/stable-venv/bin/python -m pip ${cmd#pip } --no-deps || return $?
  /tmp/stable-venv/bin/python -m pip show flash-attn
  /tmp/stable-venv/bin/python -c "import flash_attn, torch; print(flash_attn.__file__, torch.__version__)"
}

pt="/tmp/per-torch"
step per-torch-build per_torch_wheel
P="$(ls -t wheels/flash_attn-2*torch2.11cxx11abiTRUE*.hd128-cp312-cp312-*.whl 2>/dev/null | head -1)"
[ -n "$P" ] && step per-torch-install "$PY" -m pip install -q --no-deps --target "$pt" "$P"
step gate-parity attnforge parity run --wheel "$WHEEL" --suites flash --quick --record --out "$OUT/gate"
step serve-install serve_and_install
SITE="$(/tmp/stable-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
step parity /tmp/stable-venv/bin/python -m attnforge.parity.parity_run --suites flash,hf \
  --manifest "$WHEEL.manifest.json" --wheel "$(basename "$WHEEL")" --out reports/gpu --stem stable_abi_parity \
  --upstream-tests "$UPSTREAM" --upstream-sample 280 --upstream-budget-s 420
step stable-abi-tests /tmp/stable-venv/bin/python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_stable_abi_wheel.py
step hf-dropout python3 scripts/hf_training_step.py --stable "$SITE" --per-torch "$pt" --dropout 0.1 --tolerance 0.02 \
  --out "$OUT/hf_training_dropout.json"
step hf-no-dropout python3 scripts/hf_training_step.py --stable "$SITE" --per-torch "$pt" --dropout 0.0 \
  --tolerance 0.005 --out "$OUT/hf_training_no_dropout.json"
step benchmark python3 benchmarks/stable_abi.py --stable "$SITE" --per-torch "$pt" --out-dir benchmarks/results \
  --name "$NAME"
kill "$(cat "$OUT/serve.pid" 2>/dev/null)" 2>/dev/null
exit "$failed"
