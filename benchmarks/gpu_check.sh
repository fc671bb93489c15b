#!/usr/bin/env bash
# The GPU checks of issue 16, in one run of under 8 minutes on one GPU, figures to ONE file.
#
#   bash benchmarks/gpu_check.sh [RESULTS_FILE]      (default: $OUT/gpu_check.txt if OUT is set,
#                                                      else gpu_check.txt in the repository root)
#
# 1. the `cuda` tests (tests/test_cuda.py: every optimizer cuda vs cpu, a few-step fit of every task
#    on accelerator=gpu, 2-GPU DDP when two GPUs are present);
# 2. optimizer.step() alone on the GPU (SQP-Adam, SQP-HeavyBall, Adam(con) vs torch Adam);
# 3. whole training steps per task, SQP-Adam(con) / Adam(unc) (benchmarks/bench_gpu_steps.py).
# Each part has its own time limit, so one slow part cannot eat the others' budget. Without a GPU
# the script says so and exits 0 (nothing to measure).
set -u
cd "$(dirname "$0")/.."
RESULTS="${1:-${OUT:-.}/gpu_check.txt}"
mkdir -p "$(dirname "$RESULTS")"
: > "$RESULTS"
log() { echo "$@" | tee -a "$RESULTS"; }
run() {  # run LIMIT_SECONDS TITLE COMMAND...: its output into the results file, its time and status
  local limit=$1 title=$2; shift 2
  log ""; log "## $title"; log "\$ $*"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | grep -v -E "^(INFO|GPU available|TPU available|HPU available|LOCAL_RANK)|litlogger|Tip:" | tee -a "$RESULTS"
  local status=${PIPESTATUS[0]}
  log "[$title: exit $status, $((SECONDS - start)) s (limit $limit s)]"
}

log "# gpu_check $(date -u +%FT%TZ)"
log "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
python - <<'EOF' 2>&1 | tee -a "$RESULTS"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs: {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB")
EOF
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  log "No CUDA device: nothing to check here (the cuda tests skip)."
  exit 0
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$RESULTS"

run 200 "cuda tests" python -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider
run 90 "optimizer step on the GPU (ms per step, ratio to torch Adam)" \
  python benchmarks/bench_gpu_steps.py --optimizer-only --accelerator gpu --sizes 1e5 1e6 --ms 10 50 --rounds 2
run 150 "training steps per task on the GPU: SQP-Adam(con) / Adam(unc)" \
  python benchmarks/bench_gpu_steps.py --accelerator gpu --steps 30 --warmup 5 --rounds 2
log ""
log "total: $SECONDS s"
