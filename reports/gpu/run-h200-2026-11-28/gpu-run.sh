#!/usr/bin/env bash
# GPU run 2026-11-28: the stable-ABI FA2 wheel built against this machine's torch, parity, the profile-limit message, doctor
set -x
py=$(command -v python3)
R=reports/gpu/run-h200-2026-11-28
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.version.cuda)" >> "$R/gpu.txt"
/usr/bin/time -v attnforge build -t fa2-stable --python "$py" --max-jobs 16 --nvcc-threads 1 --quiet > "$R/build.log" 2>&1 || exit 4
W=$(ls -t wheels/flash_attn-*abi3*.whl | head -1)
sha256sum "$W" > "$R/wheel.sha256"
attnforge parity run --wheel "$W" --suites flash --out "$R" --stem stable_abi_parity > "$R/parity.log" 2>&1
echo "parity exit $?" >> "$R/parity.log"
mkdir -p /tmp/fa2s && python3 -m pip install -q --no-deps --no-index --target /tmp/fa2s "$W" .whl/einops-*.whl
PYTHONPATH=/tmp/fa2s:$PYTHONPATH python3 - > "$R/profile_limit.txt" 2>&1 <<'PY'
import torch
from flash_attn import flash_attn_func
for d, dt in ((64, torch.bfloat16), (128, torch.bfloat16)):
    q = torch.randn(1, 128, 4, d, device="cuda", dtype=dt)
    try:
        o = flash_attn_func(q, q, q)
        print(f"head dim {d}: ok {tuple(o.shape)}")
    except Exception as e:
        print(f"head dim {d}: {type(e).__name__}: {e}")
PY
PYTHONPATH=/tmp/fa2s:$PYTHONPATH attnforge doctor --python "$py" > "$R/doctor.txt" 2>&1; echo "doctor exit $?" >> "$R/doctor.txt"
cp wheels/*.manifest.json "$R/" 2>/dev/null
