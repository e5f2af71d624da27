#!/usr/bin/env bash
# The checks that need a GPU, as one short run for a lent device (well under
# 5 minutes): CuPy present and a device visible, then tests/gpu (device
# arrays through the staged backend in one process and on 2 ranks sharing
# the GPU, the NCCL backend (allreduce, broadcast, allgather) and a CuPy
# GradientBucketer on one rank per GPU, the torch adapter on CUDA tensors
# where torch with CUDA is installed), then the overlap benchmark on the
# GPU (bucketed overlap vs reduce-after-backward). Everything else runs on
# the CPU in CI. Usage: scripts/gpu_check.sh  (from the repository root, in
# an environment where `pip install -e ".[test,gpu]"` was run).
set -uo pipefail
cd "$(dirname "$0")/.."
echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5
python - <<'PY'
import cupy
print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())
PY
echo "== tests/gpu"
timeout 300 python -m pytest tests/gpu -q -p no:cacheprovider -rs
echo "== overlap benchmark (CuPy; 2 ranks: NCCL with 2+ GPUs, staged on one)"
timeout 150 rabit-run -n 2 python scripts/bench_overlap.py --device cuda --steps 8 \
    --json bench-results/overlap-gpu.json
