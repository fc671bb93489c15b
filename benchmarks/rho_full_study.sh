#!/usr/bin/env bash
# Issue 10: the paper's rho vs the full normal step (rho_k = 1/lr_k) for SQP-Adam and SQP-HeavyBall on
# the four tasks at their embedded default budgets and the paper's two learning rates (one seed).
# Tables: results/rho/<task>/table.md (summarized in docs/results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--methods sqp_adam,sqp_heavyball --rho paper,full --full-seeds 1 --minibatch-seeds 1 --no-progress)
lit-constrained compare --task spring    "${common[@]}" --modes full      --max-epochs 5000 --out results/rho/spring
lit-constrained compare --task chemistry "${common[@]}" --modes full      --max-epochs 2000 --out results/rho/chemistry
lit-constrained compare --task burgers   "${common[@]}" --modes full      --max-epochs 1000 --out results/rho/burgers
lit-constrained compare --task darcy     "${common[@]}" --modes minibatch --max-epochs 150  --out results/rho/darcy
