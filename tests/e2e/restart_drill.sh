#!/usr/bin/env bash
# restart_drill.sh STEPS INTERVAL BIN CONFIG WORKDIR [SEED]: the DeepSeek-V3 debug model on 4 CPU
# ranks (dp_replicate 2 x dp_shard 2, so FSDP 2, with EP 2) trains STEPS steps with a checkpoint
# every INTERVAL, and is killed three times: twice a random rank gets SIGKILL at a random moment,
# once a random rank is killed in the middle of writing a checkpoint (the writer's fault hook).
# After each kill the same command runs again and resumes from the latest complete checkpoint.
# Checks: every loss and gradient norm ever logged (the dead attempts' too) is bitwise the
# uninterrupted run's for that step, every step was logged, and the final checkpoints' tensor
# files are byte-identical. Prints the figures: wall time, kills, steps lost (redone).
# CI runs it reduced (40 steps, interval 10); the soak (ctest label soak) runs 300 / 25.
set -u
steps=$1 interval=$2 bin=$3 cfg=$4 work=$5
RANDOM=${6:-$$}
fail() {
  echo "FAIL (restart drill): $*"
  exit 1
}
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$cfg" --nproc 4 --parallelism.data_parallel_replicate_degree 2
  --parallelism.data_parallel_shard_degree 2 --parallelism.expert_parallel_degree 2
  --training.seq_len 32 --training.local_batch_size 2 --training.steps "$steps"
  --metrics.log_freq 1 --checkpoint.enable true --checkpoint.interval "$interval"
  --checkpoint.keep_latest_k 3 --checkpoint.last_save_model_only false --comm.train_timeout_seconds 60)
fields() { sed -E 's/.*"grad_norm":([^,]*),"loss":([^,]*),.*"step":([0-9]+),.*/\3 \2 \1/' "$1"; }
logged() { [ -f "$work/run/metrics.jsonl" ] && wc -l <"$work/run/metrics.jsonl" || echo 0; }
# The last step logged after line SKIP (default 0) of the run's metrics, 0 when none is (the file
# exists, empty, from a run's start; a resumed run appends to the dead attempts' lines).
last_step() {
  local s=
  [ -f "$work/run/metrics.jsonl" ] &&
    s=$(tail -n +$((${1:-0} + 1)) "$work/run/metrics.jsonl" | fields /dev/stdin | tail -1 | cut -d' ' -f1)
  [[ $s =~ ^[0-9]+$ ]] && echo "$s" || echo 0
}
latest_ckpt() { ls "$work/run/checkpoint" 2>/dev/null | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -1; }

t_start=$SECONDS
"$bin" "${common[@]}" --job.dump_folder "$work/ref" >"$work/ref.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -3 "$work/ref.log")"
t_ref=$((SECONDS - t_start))

# Which kill is the one during a save: 1, 2 or 3.
save_kill=$((RANDOM % 3 + 1))
kills=0 lost=0 attempt=0
t_drill=$SECONDS
while :; do
  attempt=$((attempt + 1))
  [ $attempt -gt 8 ] && fail "more than 8 attempts"
  from=$(latest_ckpt)
  from=${from:-0}
  env=()
  target=0
  if [ $kills -lt 3 ]; then
    victim_rank=$((RANDOM % 4))
    if [ $((kills + 1)) = $save_kill ]; then
      # The N-th file write of this attempt on that rank: inside the first save it makes. Only
      # the first replica (ranks 0 and 1) writes files under HSDP (one replica of each piece is
      # written), so the victim is one of those; a rank of the other replica would never fire.
      victim_rank=$((RANDOM % 2))
      env=(MESHTRAIN_CHECKPOINT_FAULT="kill@$((RANDOM % 6 + 1)):rank=$victim_rank")
    else
      # A random step in this kill's third of the run (after the resume point, before the last
      # steps), then a random moment inside it: the three kills cannot all crowd the end.
      lo=$((kills * steps / 3 + 1)); [ $lo -le $from ] && lo=$((from + 1))
      hi=$(((kills + 1) * steps / 3)); [ $hi -gt $((steps - 3)) ] && hi=$((steps - 3))
      [ $hi -lt $lo ] && hi=$lo
      target=$((lo + RANDOM % (hi - lo + 1)))
    fi
  fi
  before=$(logged)
  env "${env[@]+"${env[@]}"}" "$bin" "${common[@]}" --job.dump_folder "$work/run" \
    >"$work/attempt-$attempt.log" 2>&1 &
  job=$!
  if [ $target -gt 0 ]; then
    # This attempt's own lines: the kill lands inside a step of this run, never in its startup.
    while kill -0 $job 2>/dev/null && [ "$(last_step "$before")" -lt $target ]; do sleep 0.05; done
    sleep "0.$((RANDOM % 5))"
    pid=$(cut -d' ' -f2 "$work/run/.ranks/rank-$victim_rank" 2>/dev/null)
    [ -n "$pid" ] || fail "attempt $attempt: no pid for rank $victim_rank in $work/run/.ranks at step $(last_step)"
    kill -KILL "$pid" 2>/dev/null
  fi
  t0=$SECONDS
  wait $job
  rc=$?
  if [ $rc = 0 ]; then
    [ "$(last_step)" = "$steps" ] || fail "attempt $attempt exited 0 before step $steps"
    [ $kills -ge 3 ] || fail "attempt $attempt ran to the end: its planned kill (kill $((kills + 1)): ${env[*]-step ~$target}) did not happen"
    break
  fi
  [ $kills -ge 3 ] && fail "attempt $attempt failed without a planned kill: $(grep meshtrain: "$work/attempt-$attempt.log" | head -3)"
  grep -q "meshtrain: rank [0-9]: .*cannot complete: rank $victim_rank .* is gone\|MESHTRAIN_CHECKPOINT_FAULT kill@" \
    "$work/attempt-$attempt.log" || fail "attempt $attempt: no line naming the lost rank $victim_rank: $(grep meshtrain: "$work/attempt-$attempt.log" | head -3)"
  kills=$((kills + 1))
  reached=$(last_step)
  now=$(latest_ckpt)
  lost=$((lost + reached - ${now:-0}))
  what=$([ ${#env[@]} -gt 0 ] && echo "during a save (${env[0]#*=})" || echo "at step ~$target")
  echo "kill $kills: rank $victim_rank $what; logged up to step $reached; resumes from step ${now:-0}"
  for d in "$work"/run/checkpoint/step-*; do
    [ -e "$d" ] && { [ -f "$d/index.json" ] || fail "$d is visible without its index"; }
  done
done
t_drill=$((SECONDS - t_drill))

# Every line ever logged equals the uninterrupted run's line for its step; every step is there.
fields "$work/ref/metrics.jsonl" >"$work/ref.fields"
fields "$work/run/metrics.jsonl" >"$work/run.fields"
bad=$(awk 'NR == FNR { want[$1] = $0; next } want[$1] != $0 { print; exit }' "$work/ref.fields" "$work/run.fields")
[ -z "$bad" ] || fail "a logged step differs from the uninterrupted run: got '$bad', want '$(grep "^${bad%% *} " "$work/ref.fields")'"
[ "$(cut -d' ' -f1 "$work/run.fields" | sort -un | wc -l)" = "$steps" ] || fail "not every step was logged"
for f in "$work/ref/checkpoint/step-$steps"/*.safetensors; do
  cmp -s "$f" "$work/run/checkpoint/step-$steps/$(basename "$f")" ||
    fail "final tensors differ: $(basename "$f")"
done
[ $kills = 3 ] || fail "$kills kills, expected 3"
echo "ok (restart drill): $steps steps, interval $interval, $kills kills ($attempt attempts), $lost steps redone; uninterrupted run ${t_ref} s, drill ${t_drill} s; every logged loss and the final tensors bitwise equal"
