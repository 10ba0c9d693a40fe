# The multi-rank modes of scripts/gpu_test.sh (sourced there, after the libraries are found):
#   run_layouts [REGEX]  the layout table tests/dist/parity/cuda_layouts.txt through the parity
#                        binary, float32 and bfloat16, several jobs at once within
#                        MESHTRAIN_LAYOUT_RANKS ranks; one line per layout and precision, and
#                        $OUT/layouts.tsv / layouts.json
#   run_traces           profiled FSDP 2 + TP 2 + EP 2 and HSDP 2x2 + TP 2 + EP 2 training runs
#                        (per-rank Chrome traces under $OUT/traces/<layout>), summarised by
#                        scripts/trace_summary.py; first, the shared-GPU error check
# Ranks take one GPU each when the machine has enough, else they share (MESHTRAIN_SHARE_GPU=1,
# NCCL over sockets on lo): results exact, communication speed not representative. A
# MESHTRAIN_SHARE_GPU already in the environment wins.

gpu_count() {
  local n
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  echo "${n:-0}"
}

# share_for NP: 1 when NP ranks need to share the visible GPUs.
share_for() {
  if [ -n "${MESHTRAIN_SHARE_GPU:-}" ]; then echo "$MESHTRAIN_SHARE_GPU"; return; fi
  if [ "$(gpu_count)" -ge "$1" ]; then echo 0; else echo 1; fi
}

mpirun_cmd() {
  local np=$1
  MPIRUN=(mpirun -np "$np" --oversubscribe --bind-to none)
  [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
  MPIRUN+=(-x LD_LIBRARY_PATH -x MESHTRAIN_SHARE_GPU -x NCCL_NVLS_ENABLE -x OPENBLAS_NUM_THREADS)
}

run_layouts() {
  local filter=${1:-} table=${MESHTRAIN_LAYOUT_TABLE:-$ROOT/tests/dist/parity/cuda_layouts.txt}
  local precisions=${MESHTRAIN_LAYOUT_PRECISIONS:-float32,bfloat16}
  local parity=$BIN_DIR/tests/dist/meshtrain_dist_parity
  local budget=${MESHTRAIN_LAYOUT_RANKS:-8} limit=${MESHTRAIN_LAYOUT_TIMEOUT:-540}
  local dir=$OUT/layouts common="" name np rest
  mkdir -p "$dir"
  export OPENBLAS_NUM_THREADS=1
  # Ranks waiting in MPI (while rank 0 runs the reference) yield their core to the others.
  export OMPI_MCA_mpi_yield_when_idle=1
  local ngpu; ngpu=$(gpu_count)
  echo "== layouts: $ngpu GPU(s) visible; at most $budget ranks at once; $limit s per job =="
  local -a names=() pids=() nps=()
  local running=0 i
  reap() {  # drop finished jobs from the running count
    for i in "${!pids[@]}"; do
      if [ -n "${pids[$i]}" ] && ! kill -0 "${pids[$i]}" 2>/dev/null; then
        wait "${pids[$i]}" 2>/dev/null || true
        running=$((running - nps[i])); pids[$i]=""
      fi
    done
  }
  while read -r name np rest; do
    case "$name" in ''|'#'*) continue ;; common) common="$np $rest"; continue ;; esac
    if [ -n "$filter" ] && ! [[ $name =~ $filter ]]; then continue; fi
    while [ "$running" -gt 0 ] && [ $((running + np)) -gt "$budget" ]; do reap; sleep 1; done
    local share; share=$(share_for "$np")
    mpirun_cmd "$np"
    # shellcheck disable=SC2086  # the table's arguments are words
    (
      export MESHTRAIN_SHARE_GPU=$share
      start=$(date +%s) rc=0
      # `|| rc=$?`: under the caller's errexit a failing job would end this subshell unrecorded.
      timeout -k 10 "$limit" "${MPIRUN[@]}" "$parity" --name "$name" \
        --precisions "$precisions" $common $rest --training.dataset text \
        --training.dataset_path "$ROOT/ARCHITECTURE.md" --job.dump_folder "$dir/$name" \
        < /dev/null > "$dir/$name.log" 2>&1 || rc=$?  # mpirun forwards stdin: not the table
      echo "$rc $(( $(date +%s) - start )) $share" > "$dir/$name.rc"
    ) &
    names+=("$name"); pids+=($!); nps+=("$np"); running=$((running + np))
    echo "started $name ($np ranks, $([ "$share" = 1 ] && echo "sharing $ngpu GPU(s)" || echo "one GPU per rank"))"
  done < "$table"
  while [ "$running" -gt 0 ]; do reap; sleep 1; done

  local tsv=$OUT/layouts.tsv fails=0 rc secs share line
  printf 'layout\tranks\tmode\tprecision\tstatus\tloss\tgrad_norm\tmean_loss\tparam\ttol\trouting\tseconds\n' > "$tsv"
  echo
  echo "== layouts vs the 1-rank CUDA run: worst relative loss / grad norm per step, final params =="
  for name in "${names[@]}"; do
    read -r rc secs share < "$dir/$name.rc" || { rc=1; secs=0; share=?; }
    local mode; mode=$([ "$share" = 1 ] && echo shared || echo gpu_per_rank)
    local got=0
    while read -r line; do
      # LAYOUT name precision status ranks N steps S loss X grad_norm Y mean_loss M param P tol T
      # routing R (the share of a layer's routed tokens that moved; judged in float32 only)
      set -- $line
      printf '%-30s %-8s %s  loss %s  grad_norm %s  param %s  routing %s  (%s ranks, %s, %ss)\n' \
        "$2" "$3" "$4" "${10}" "${12}" "${16}" "${20}" "$6" "$mode" "$secs"
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$2" "$6" "$mode" "$3" "$4" \
        "${10}" "${12}" "${14}" "${16}" "${18}" "${20}" "$secs" >> "$tsv"
      [ "$4" = PASS ] || fails=$((fails + 1))
      got=$((got + 1))
    done < <(grep '^LAYOUT ' "$dir/$name.log" || true)
    local want; want=$(tr ',' '\n' <<< "$precisions" | grep -c .)
    if [ "$got" -lt "$want" ] || [ "$rc" != 0 ]; then
      fails=$((fails + 1))
      printf '%-30s FAIL: exit %s after %ss with %d of %d precisions reported; last lines of %s:\n' \
        "$name" "$rc" "$secs" "$got" "$want" "$dir/$name.log"
      grep -v '^step ' "$dir/$name.log" | tail -5 | sed 's/^/    /'
    fi
  done
  python3 - "$tsv" "$OUT/layouts.json" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for r in rows:
    for k in ("loss", "grad_norm", "mean_loss", "param", "tol", "routing"):
        r[k] = float(r[k])
    r["ranks"] = int(r["ranks"])
json.dump({"layouts": rows}, open(sys.argv[2], "w"), indent=1)
PY
  echo "== layouts: ${#names[@]} run, $fails failure(s); $tsv =="
  [ "$fails" -eq 0 ]
}

run_traces() {
  local exe=$BIN_DIR/meshtrain cfg=$ROOT/configs/deepseek_v3_debug.toml fails=0
  export OPENBLAS_NUM_THREADS=1
  mkdir -p "$OUT/traces"
  local ngpu; ngpu=$(gpu_count)
  local -a common=(--job.device cuda --model.n_layers 3 --training.dataset text
    --training.dataset_path "$ROOT/ARCHITECTURE.md" --training.steps 4 --metrics.log_freq 1
    --profiling.enable_profiling true --profiling.profile_freq 2)
  if [ "$ngpu" -lt 2 ] && [ -z "${MESHTRAIN_SHARE_GPU:-}" ]; then
    echo "== two ranks on one GPU without --share-gpu: a clear error, not NCCL's =="
    if timeout 120 "$exe" train --config "$cfg" --nproc 2 "${common[@]}" \
      --job.dump_folder "$OUT/traces/no_share" > "$OUT/traces/no_share.log" 2>&1; then
      echo "FAIL: two ranks on one GPU ran without --share-gpu"; fails=$((fails + 1))
    elif grep -q "suggest\|--share-gpu" "$OUT/traces/no_share.log"; then
      grep -m1 "share-gpu" "$OUT/traces/no_share.log" | cut -c1-400
    else
      echo "FAIL: the error does not mention --share-gpu:"; tail -5 "$OUT/traces/no_share.log"
      fails=$((fails + 1))
    fi
  fi
  local spec name np tracks rest share
  # NAME RANKS TRACKS ARGS: the tracks every rank's trace must hold.
  for spec in "fsdp2_tp2_ep2 4 compute,fsdp,tp,ep,efsdp --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2" \
              "hsdp2x2_tp2_ep2 8 compute,fsdp,tp,ep,efsdp,dp_replicate --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --parallelism.expert_parallel_degree 2"; do
    read -r name np tracks rest <<< "$spec"
    share=$(share_for "$np")
    local -a flag=(); [ "$share" = 1 ] && flag=(--share-gpu)
    echo "== traces: $name ($np ranks${flag:+, --share-gpu}) =="
    # shellcheck disable=SC2086
    if ! timeout 300 "$exe" train --config "$cfg" --nproc "$np" "${flag[@]}" "${common[@]}" $rest \
      --job.dump_folder "$OUT/traces/$name" > "$OUT/traces/$name.log" 2>&1; then
      echo "FAIL: $name exited non-zero; last lines:"; tail -8 "$OUT/traces/$name.log"
      fails=$((fails + 1)); continue
    fi
    grep -m1 "gpu sharing" "$OUT/traces/$name.log" || true
    grep "^step: " "$OUT/traces/$name.log" | tail -2 || true
    python3 "$ROOT/scripts/trace_summary.py" --expect-tracks "$tracks" \
      "$OUT/traces/$name/profile_traces/iteration_4" > "$OUT/traces/$name.summary.txt" ||
      fails=$((fails + 1))
    cat "$OUT/traces/$name.summary.txt"
  done
  [ "$fails" -eq 0 ]
}
