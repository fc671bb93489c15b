#!/usr/bin/env bash
# Chemistry at the paper's size and budget (the paper configs), with the task's fixed affine normalization
# on (the paper-budget grid runs without it): does SQP-Adam(con) then perform best? One seed (0).
# Full batch at lr 5e-4 (SQP-Adam, SQP-HeavyBall, Adam(unc)); mini-batch at lr 5e-4 and 1e-4 (all four).
# Each run's fit summary (objective, max |c|, val/mse) ends its log in results/normalization_check/.
#   bash benchmarks/chemistry_normalization_check.sh        (~1 h on one core)
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/normalization_check
mkdir -p "$out"
run() {  # method batch_mode lr
  OMP_NUM_THREADS=1 lit-constrained fit --config "configs/chemistry/paper/$1.yaml" \
    --model.init_args.normalize true --model.init_args.num_threads 1 \
    --data.init_args.batch_mode "$2" --model.init_args.optimizer.init_args.lr "$3" \
    --trainer.logger false --trainer.enable_checkpointing false --trainer.enable_progress_bar false \
    > "$out/$2_$1_lr$3.log" 2>&1
}
for method in sqp_adam sqp_heavyball adam_unc; do run "$method" full 5e-4; done
for lr in 5e-4 1e-4; do
  for method in sqp_adam sqp_heavyball adam_con adam_unc; do run "$method" minibatch "$lr"; done
done
