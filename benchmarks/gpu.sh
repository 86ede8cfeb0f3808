#!/usr/bin/env bash
# One prepared accelerator check: `base` train step at length 512 in bfloat16 with cuDNN fused
# attention (falls back to XLA attention, and says so, where cuDNN is unavailable): step time,
# tokens/s and MFU (analytic 6NT + attention FLOPs, and XLA cost_analysis FLOPs).
#
#   bash benchmarks/gpu.sh                       # on a GPU machine (~2-4 minutes incl. compile)
#   bash benchmarks/gpu.sh --peak_tflops=989     # override the peak table
#   bash benchmarks/gpu.sh --smoke               # tiny sizes; runs anywhere, e.g. on CPU
#
# Extra arguments go to benchmarks/accelerator.py. Results: stdout and $OUT/accelerator.json
# ($OUT defaults to a temp dir). Needs a CUDA build of jaxlib on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader || echo "nvidia-smi: not found"
python -c 'import jax; print("jax", jax.__version__, "backend:", jax.default_backend(), jax.devices())'
timeout "${GPU_TIMEOUT:-540}" python benchmarks/accelerator.py --size=base --length=512 \
  --batch_size="${BATCH_SIZE:-32}" --dtype=bfloat16 --attention=auto --steps=20 \
  --json="$OUT/accelerator.json" "$@"
echo "wrote $OUT/accelerator.json"
