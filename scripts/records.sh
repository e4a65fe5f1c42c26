#!/usr/bin/env bash
# Re-measure the benchmark records under docs/results/ that the README's and docs' tables are built
# from, one script at a time (run it on a quiet machine: the figures are timings), then rebuild the
# tables: scripts/doc_tables.py. Each record keeps its command, commit, date and machine.
#
#   scripts/records.sh            # every record (about an hour on 2 cores)
#   scripts/records.sh sandbox    # the named ones (see RECORDS below)
#   scripts/records.sh credit_suite  # the controlled credit suite, every method, 10 seeds (many hours
#                                    # on 2 cores; not in the default list). Its runs are kept in
#                                    # bench-runs/credit-suite (git-ignored): stop it any time and rerun
#                                    # to resume. The record is written when every cell has run; its
#                                    # per-seed rows (credit_suite_runs.csv, one per run;
#                                    # credit_suite_evals.csv, one per evaluation) and the suite as it
#                                    # ran (credit_suite.yaml) are kept beside it
#   scripts/records.sh credit_suite_key_door  # its key_door_long env with GRPO, RLOO and the turn-level
#                                    # methods, 10 seeds (about an hour on 2 cores; same run folder)
#   scripts/records.sh credit_suite_key_door_confirm  # GiGPO against GRPO there on 10 fresh seeds
#                                    # (10-19), one comparison: the confirmation of what seeds 0-9 showed
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=docs/results
SUITE_OUT=bench-runs/credit-suite

declare -A RECORDS=(
  [learner_loop]="scripts/bench_learner_loop.py --json $OUT/bench_learner_loop.json"
  [learner_scaling]="scripts/bench_learner_scaling.py --json $OUT/bench_learner_scaling.json"
  [segments]="scripts/bench_segments.py --json $OUT/bench_segments.json"
  [mfu]="scripts/bench_mfu.py --hidden-size 896 --layers 2 --vocab-size 3000 --rows 16 --seq-len 256 --micro-batch-size 8 --json $OUT/bench_mfu_cpu.json"
  [sandbox]="scripts/bench_sandbox.py --json $OUT/bench_sandbox.json"
  [trl]="scripts/bench_trl.py --json $OUT/bench_trl.json"
  [turns]="scripts/bench_turns.py --json $OUT/bench_turns.json"
  [turns_qwen_layers]="scripts/bench_turns.py --hidden-size 896 --heads 14 --kv-heads 2 --intermediate-size 4864 --modes rows,update --json $OUT/bench_turns_qwen_layers.json"
  [vllm_rollout]="scripts/bench_vllm_rollout.py --json $OUT/bench_vllm_rollout.json"
  [weight_push]="scripts/bench_weight_push.py --json $OUT/bench_weight_push.json"
  [routing]="scripts/bench_routing.py --json $OUT/bench_routing.json"
  [gateway]="scripts/bench_gateway.py --json $OUT/bench_gateway.json"
  [scale]="scripts/bench_scale.py --json $OUT/bench_scale.json"
  [async]="scripts/bench_async.py --json $OUT/bench_async.json"
  [corrections]="scripts/bench_corrections.py --json $OUT/bench_corrections.json"
  [keep_rollouts]="scripts/bench_keep_rollouts.py --json $OUT/bench_keep_rollouts.json"
  [view]="scripts/bench_view.py --json $OUT/bench_view.json"
  [baselines]="-m turnrl baselines --json $OUT/baselines.json"
  [eval_demo]="scripts/eval_demo.py --json $OUT/eval_demo.json"
  [credit_lab]="-m turnrl credit-lab --out ${TMPDIR:-/tmp}/turnrl-credit-lab --no-progress --json $OUT/credit_lab.json"
  [credit_suite]="-m turnrl bench --suite credit --workers 2 --no-progress --out $SUITE_OUT --json $OUT/credit_suite.json"
  [credit_suite_key_door]="-m turnrl bench --suite credit --envs key_door_long --methods grpo rloo gigpo turn_gae bilevel_gae turn_ppo --workers 2 --no-progress --out $SUITE_OUT --json $OUT/credit_suite_key_door.json"
  [credit_suite_key_door_confirm]="-m turnrl bench --suite credit --envs key_door_long --methods grpo gigpo --seeds 10 11 12 13 14 15 16 17 18 19 --workers 2 --no-progress --out $SUITE_OUT --json $OUT/credit_suite_key_door_confirm.json"
  [readme_demo]="scripts/readme_demo.py --json $OUT/readme_demo.json"
)
ORDER=(learner_loop learner_scaling segments mfu sandbox trl vllm_rollout weight_push routing gateway scale async corrections keep_rollouts view eval_demo baselines credit_lab turns turns_qwen_layers
       readme_demo)

if [[ -n "$(git status --porcelain --untracked-files=no -- turnrl scripts)" ]]; then
  echo "turnrl/ or scripts/ has uncommitted changes: commit them first, a record names the commit it measured" >&2
  exit 2
fi
names=("$@")
[[ ${#names[@]} -eq 0 ]] && names=("${ORDER[@]}")
for name in "${names[@]}"; do
  [[ -n "${RECORDS[$name]:-}" ]] || { echo "unknown record '$name'; known: ${ORDER[*]}" >&2; exit 2; }
done
for name in "${names[@]}"; do
  echo "== $name: python ${RECORDS[$name]}"
  start=$SECONDS
  # shellcheck disable=SC2086
  "$PY" ${RECORDS[$name]}
  [[ $name == credit_lab ]] && cp "${TMPDIR:-/tmp}/turnrl-credit-lab/lab.png" docs/credit_lab.png
  if [[ $name == credit_suite* ]]; then
    cp $SUITE_OUT/results.csv $OUT/${name}_runs.csv
    cp $SUITE_OUT/evals.csv $OUT/${name}_evals.csv
    cp $SUITE_OUT/suite.yaml $OUT/${name}.yaml
  fi
  echo "== $name: $((SECONDS - start)) s"
done
"$PY" scripts/doc_tables.py
