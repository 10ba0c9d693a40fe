#!/usr/bin/env bash
# The PyTorch cross-check of meshtrain's models (item 6 of issue 13). For each case: write a token
# file, train 10 steps with meshtrain on the CPU device in float32 ([debug] dump_step = 1 dumps the
# step-1 weights as an HF folder, the step-1 gradients and expert loads), then replay the same
# batches with the independent PyTorch reference (crosscheck.py) and compare.
#
#   tests/reference/run_crosscheck.sh MESHTRAIN_BINARY OUT_DIR [CASE ...]
#
# Cases (default: all but the multi-rank one):
#   llama3_debug         configs/llama3_debug.toml
#   deepseek_v3_debug    configs/deepseek_v3_debug.toml (MLA without q_lora, softmax router with
#                        expert bias, 2 shared experts, 1 dense layer)
#   deepseek_v3_16b_2l   configs/deepseek_v3_16b.toml cut to 2 layers (1 dense + 1 MoE of 64
#                        experts), its 102400 vocab; ~17 GiB of meshtrain state, ~35 GiB reference
#   deepseek_v3_small    configs/deepseek_v3_small.json: the V3 layout (q_lora, sigmoid scores,
#                        4 groups of which 2, route_norm, route scale 2.5, YaRN, 2 dense layers)
#   deepseek_v2_groups   configs/deepseek_v2_groups.json: softmax scores in groups, route scale 16,
#                        q_lora, no YaRN
#   deepseek_v3_mtp_d1   deepseek_v3_small with one multi-token-prediction module (a MoE block,
#                        as the release's) and mtp_loss_weight 0.3
#   deepseek_v3_mtp_d2   the same with two modules (the second fed by the first) and weight 0.5
#   deepseek_v3_debug_fsdp4_ep2  the debug model on 4 ranks (FSDP 4 + EP 2; needs mpirun)
#
# Environment: PYTHON (default python3, needs torch), REF_DEVICE (auto|cuda|cpu), REF_DTYPE
# (float64|float32), RESULTS_DIR (copy summary.json and each case's result.json and logs there,
# without the multi-GB dumps). Prints PASS/FAIL per case with the worst relative errors;
# OUT_DIR/summary.json holds every case's numbers. Exit status 0 only if every case passed.
set -u -o pipefail

if [ $# -lt 2 ]; then
  sed -n '2,28p' "$0"
  exit 2
fi
BIN=$(realpath "$1")
OUT=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
CASES=("$@")
[ ${#CASES[@]} -eq 0 ] && CASES=(llama3_debug deepseek_v3_debug deepseek_v3_small deepseek_v2_groups
                                  deepseek_v3_mtp_d1 deepseek_v3_mtp_d2 deepseek_v3_16b_2l)
mkdir -p "$OUT"

COMMON=(--training.steps 10 --metrics.log_freq 1 --training.seq_len 64 --training.local_batch_size 4
        --training.dataset tokens --lr_scheduler.warmup_steps 2 --debug.dump_step 1
        --job.device cpu --training.mixed_precision_param float32 --training.master_dtype float32)

case_args() {  # config and overrides of one case
  case $1 in
    llama3_debug) echo "--config $ROOT/configs/llama3_debug.toml --model.vocab_size 512" ;;
    deepseek_v3_debug) echo "--config $ROOT/configs/deepseek_v3_debug.toml --model.vocab_size 512" ;;
    deepseek_v3_16b_2l) echo "--config $ROOT/configs/deepseek_v3_16b.toml --model.n_layers 2" ;;
    deepseek_v3_small) echo "--config $ROOT/configs/deepseek_v3_debug.toml --model.hf_config $HERE/configs/deepseek_v3_small.json" ;;
    deepseek_v2_groups) echo "--config $ROOT/configs/deepseek_v3_debug.toml --model.hf_config $HERE/configs/deepseek_v2_groups.json" ;;
    deepseek_v3_mtp_d1) echo "--config $ROOT/configs/deepseek_v3_debug.toml --model.hf_config $HERE/configs/deepseek_v3_small.json --model.mtp_layers 1 --model.mtp_loss_weight 0.3" ;;
    deepseek_v3_mtp_d2) echo "--config $ROOT/configs/deepseek_v3_debug.toml --model.hf_config $HERE/configs/deepseek_v3_small.json --model.mtp_layers 2 --model.mtp_loss_weight 0.5" ;;
    deepseek_v3_debug_fsdp4_ep2) echo "--config $ROOT/configs/deepseek_v3_debug.toml --model.vocab_size 512 --nproc 4 --training.local_batch_size 1 --parallelism.data_parallel_shard_degree 4 --parallelism.expert_parallel_degree 2" ;;
    *) return 1 ;;
  esac
}

status=0
results=()
for c in "${CASES[@]}"; do
  if ! args=$(case_args "$c"); then
    echo "FAIL $c: unknown case"
    status=1
    continue
  fi
  vocab=512
  [ "$c" = deepseek_v3_16b_2l ] && vocab=65536
  run="$OUT/$c"
  rm -rf "$run"
  mkdir -p "$run"
  # 10 steps x 4 rows (16 on 4 ranks) x 65 tokens: no window is read twice.
  if ! "$PY" "$HERE/crosscheck.py" tokens --out "$run/tokens.bin" --count 12000 --vocab $vocab \
      > "$run/tokens.log" 2>&1; then
    echo "FAIL $c: could not write the token file (see $run/tokens.log)"
    status=1
    continue
  fi
  start=$(date +%s)
  # shellcheck disable=SC2086
  if ! "$BIN" train "${COMMON[@]}" $args --training.dataset_path "$run/tokens.bin" \
      --job.dump_folder "$run/meshtrain" > "$run/meshtrain.log" 2>&1; then
    echo "FAIL $c: meshtrain failed (last lines of $run/meshtrain.log):"
    tail -5 "$run/meshtrain.log" | sed 's/^/    /'
    status=1
    continue
  fi
  mid=$(date +%s)
  "$PY" "$HERE/crosscheck.py" compare --run "$run/meshtrain" --tokens "$run/tokens.bin" --case "$c" \
    --json "$run/result.json" --device "${REF_DEVICE:-auto}" --dtype "${REF_DTYPE:-float64}" \
    2> "$run/reference.log" || status=1
  end=$(date +%s)
  echo "    ($c: meshtrain $((mid - start)) s, reference $((end - mid)) s)"
  results+=("$run/result.json")
done

"$PY" - "$OUT/summary.json" "${results[@]}" <<'EOF'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
summary = {}
for f in files:
    try:
        r = json.load(open(f))
    except Exception as e:  # noqa: BLE001
        summary[f] = {"pass": False, "failures": [f"unreadable result: {e}"]}
        continue
    s1 = (r.get("steps") or [{}])[0]
    summary[r["case"]] = {k: v for k, v in {
        "pass": r.get("pass"), "failures": r.get("failures"), "device": r.get("device"),
        "dtype": r.get("dtype"), "step1_loss_rel": s1.get("loss_rel"),
        "step1_grad_norm_rel": s1.get("grad_norm_rel"), "worst_grad": s1.get("grad_worst_name"),
        "worst_grad_rel": s1.get("grad_worst_rel"), "worst_loss_rel": r.get("worst_loss_rel"),
        "losses": [(x["step"], x["loss_mt"], x["loss_ref"]) for x in r.get("steps", [])],
        "step1_mtp_loss_rel": [d["rel"] for d in s1.get("mtp", [])] or None,
        "worst_mtp_loss_rel": r.get("worst_mtp_loss_rel"),
        "routing": {k: v.get("min_choice_margin") for k, v in s1.get("routing", {}).items()},
    }.items() if v is not None}
json.dump(summary, open(out, "w"), indent=1)
print(f"summary: {out}")
EOF
if [ -n "${RESULTS_DIR:-}" ]; then
  mkdir -p "$RESULTS_DIR"
  cp "$OUT/summary.json" "$RESULTS_DIR/"
  for c in "${CASES[@]}"; do
    [ -d "$OUT/$c" ] || continue
    mkdir -p "$RESULTS_DIR/$c"
    cp "$OUT/$c"/*.log "$OUT/$c"/*.json "$RESULTS_DIR/$c/" 2>/dev/null || true
  done
fi
exit $status
