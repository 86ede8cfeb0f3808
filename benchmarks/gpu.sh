#!/usr/bin/env bash
# One prepared accelerator check, two parts:
# 1. benchmarks/accelerator.py: `base` train step at length 512 in bfloat16 with cuDNN fused
#    attention (falls back to XLA attention, and says so, where cuDNN is unavailable): step
#    time, tokens/s and MFU against the vendor's peak (FLOPs counted as MaxText does, and XLA
#    cost_analysis FLOPs).
# 2. benchmarks/roofline.py: this device's attainable bf16 matmul FLOP/s and memory bandwidth,
#    measured, and the same step's MFU against them (model.attention_impl=cudnn), with RoPE,
#    LayerNorm and softmax as fractions of the bandwidth floor.
#
#   bash benchmarks/gpu.sh                       # on a GPU machine (~4-6 minutes incl. compile)
#   bash benchmarks/gpu.sh --peak_tflops=989     # override accelerator.py's peak table
#   bash benchmarks/gpu.sh --smoke               # tiny sizes; runs anywhere, e.g. on CPU
#
# Extra arguments go to benchmarks/accelerator.py; ROOFLINE_ARGS (a string) adds arguments to
# roofline.py, ROOFLINE_ATTENTION sets its attention (default: cudnn, or xla where
# accelerator.py found that cuDNN's attention does not compile). Results: stdout and
# $OUT/accelerator.json, $OUT/roofline.json ($OUT defaults to a temp dir). Needs a CUDA build of
# jaxlib on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
SMOKE=0
for arg in "$@"; do [[ "$arg" == --smoke ]] && SMOKE=1; done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader || echo "nvidia-smi: not found"
python -c 'import jax; print("jax", jax.__version__, "backend:", jax.default_backend(),
  jax.devices())'
timeout "${GPU_TIMEOUT:-540}" python benchmarks/accelerator.py --size=base --length=512 \
  --batch_size="${BATCH_SIZE:-32}" --dtype=bfloat16 --attention=auto --steps=20 \
  --json="$OUT/accelerator.json" "$@"
echo "wrote $OUT/accelerator.json"
# The attention accelerator.py compiled: cudnn, or xla where cuDNN's failed (it says why).
attention=$(python -c 'import json, sys
errors = json.load(open(sys.argv[1]))["attention_errors"]
print("xla" if any(e.startswith("cudnn") for e in errors) else "cudnn")' "$OUT/accelerator.json")
if [[ $SMOKE == 1 ]]; then
  roofline=(--quick --dtypes=bfloat16)
else
  # An 8192^3 bf16 matmul and 2 GiB streamed: large enough to reach a GPU's limits.
  roofline=(--sizes=base --dtypes=bfloat16 --length=512 --batch_size="${BATCH_SIZE:-32}"
            --attention_impl="${ROOFLINE_ATTENTION:-$attention}" --matmul_size=8192
            --stream_mib=2048 --rounds=5)
fi
# shellcheck disable=SC2086  # ROOFLINE_ARGS is split into arguments on purpose
timeout "${GPU_TIMEOUT:-540}" python benchmarks/roofline.py "${roofline[@]}" ${ROOFLINE_ARGS:-} \
  --json="$OUT/roofline.json"
echo "wrote $OUT/roofline.json"
