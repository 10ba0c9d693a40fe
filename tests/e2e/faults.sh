#!/usr/bin/env bash
# faults.sh MODE BIN CONFIG WORKDIR: one fault of issue 16 on CPU ranks, end to end.
#   lost_nproc / lost_mpirun  rank 1 of 3 gets SIGKILL mid-run: the others exit non-zero within
#                             60 s, each with one line naming rank 1 and the collective it waited in
#   stall                     rank 1 stalls at step 4 ([debug] inject_stall_*): the others time out
#                             ([comm] train_timeout_seconds) naming the collective, group and rank 1
#   sigterm_nproc             SIGTERM to `meshtrain --nproc 2`: every rank stops after the same
#                             step, saves it, exits 3; the rerun resumes there and matches bitwise
#   sigterm_ranks             SIGTERM to each rank of a plain mpirun job (what a scheduler does)
#   second_signal             two SIGINTs: the ranks exit at once, nothing half-saved is visible
#   nan_stop / nan_skip       a NaN gradient on rank 1 at step 3 of an FSDP 2 run: stop naming the
#                             step (step-2 intact and resumable bitwise), or skip and count it
#   eio_stop                  a save hits EIO on rank 1: the run stops naming the file, step-4 stays
#   enospc_continue           ENOSPC with continue_on_save_error: training goes on, step-12 saved,
#                             the losses are the uninterrupted run's
#   tmpfs_full                a real 1 MiB tmpfs fills up on the second save (root with mount
#                             permission; else exit 77 = skipped, with the reason)
#   data_replaced             the token file is replaced mid-run: every rank stops naming the file
set -u
mode=$1 bin=$2 cfg=$3 work=$4
fail() {
  echo "FAIL ($mode): $*"
  exit 1
}
rm -rf "$work" && mkdir -p "$work"
tiny=(train --config "$cfg" --model.flavor tiny --training.seq_len 32 --training.local_batch_size 2
  --metrics.log_freq 1)
# Step lines of a metrics.jsonl: "step loss grad_norm".
fields() { sed -E 's/.*"grad_norm":([^,]*),"loss":([^,]*),.*"step":([0-9]+),.*/\3 \2 \1/' "$1"; }
# Waits until rank 0 logged `n` steps of the run in folder $1 (or the run ended).
wait_steps() {
  local f=$1/metrics.jsonl n=$2 pid=$3
  for _ in $(seq 600); do
    [ -f "$f" ] && [ "$(wc -l <"$f")" -ge "$n" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# Exit status of pid $1, failing when it takes more than $2 seconds.
wait_exit() {
  local pid=$1 limit=$2 t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    [ $((SECONDS - t0)) -gt "$limit" ] && {
      kill -KILL "$pid"
      fail "still running $limit s after the fault"
    }
    sleep 0.1
  done
  wait "$pid"
}
rank_pid() { cut -d' ' -f2 "$1/.ranks/rank-$2"; }

case $mode in
  lost_nproc | lost_mpirun)
    launch=(--nproc 3)
    [ "$mode" = lost_mpirun ] && launch=() && pre=(mpirun --oversubscribe --bind-to none -np 3)
    "${pre[@]+"${pre[@]}"}" "$bin" "${tiny[@]}" "${launch[@]+"${launch[@]}"}" --training.steps 100000 \
      --job.dump_folder "$work/run" >"$work/run.log" 2>&1 &
    job=$!
    wait_steps "$work/run" 20 $job || fail "the run did not reach step 20: $(tail -3 "$work/run.log")"
    sleep 1.2  # every rank's status file is written
    victim=$(rank_pid "$work/run" 1)
    kill -KILL "$victim"
    wait_exit $job 60 && fail "the job exited 0 after losing a rank"
    for r in 0 2; do
      line=$(grep "^meshtrain: rank $r: " "$work/run.log" | grep -v "stop signal")
      [ "$(echo "$line" | grep -c .)" = 1 ] || fail "rank $r printed not one line: '$line'"
      echo "$line" | grep -Eq "(all_gather|reduce_scatter|all_reduce|barrier|all_to_all_v) on '[a-z_]+' at step [0-9]+ cannot complete: rank 1 \(pid $victim on .*\) is gone" ||
        fail "rank $r's line does not name rank 1 and the collective: $line"
    done
    echo "ok ($mode): rank 1 killed; $(grep -c '^meshtrain: rank [02]: .* is gone' "$work/run.log") survivors named it"
    ;;
  stall)
    t0=$SECONDS
    "$bin" "${tiny[@]}" --nproc 3 --training.steps 100 --debug.inject_stall_step 4 \
      --debug.inject_stall_rank 1 --comm.train_timeout_seconds 3 --job.dump_folder "$work/run" \
      >"$work/run.log" 2>&1
    rc=$?
    [ $rc = 4 ] || fail "exit status $rc, expected 4: $(tail -5 "$work/run.log")"
    [ $((SECONDS - t0)) -lt 60 ] || fail "took $((SECONDS - t0)) s"
    grep -Eq "^meshtrain: rank [02]: all_gather on 'fsdp' at step 4 did not complete within \[comm\] train_timeout_seconds = 3 s: .*rank 1 \(pid [0-9]+ on .*\) is alive but in no collective \(at step 4\): stalled" \
      "$work/run.log" || fail "no timeout line naming the collective and rank 1: $(grep '^meshtrain:' "$work/run.log")"
    echo "ok (stall): $(grep -c '^meshtrain: rank [02]: all_gather' "$work/run.log") ranks named the stalled rank 1"
    ;;
  sigterm_nproc | sigterm_ranks)
    # The LR schedule is pinned to 100000 steps so that runs of any length share it: the stopped
    # run (100000 steps), its rerun to S + 20 and an uninterrupted run to S + 20.
    common=("${tiny[@]}" --lr_scheduler.total_steps 100000 --checkpoint.enable true
      --checkpoint.interval 100000 --checkpoint.last_save_model_only false)
    if [ "$mode" = sigterm_nproc ]; then
      "$bin" "${common[@]}" --training.steps 100000 --nproc 2 --job.dump_folder "$work/run" \
        >"$work/cut.log" 2>&1 &
    else
      mpirun --oversubscribe --bind-to none -np 2 "$bin" "${common[@]}" --training.steps 100000 \
        --job.dump_folder "$work/run" >"$work/cut.log" 2>&1 &
    fi
    job=$!
    wait_steps "$work/run" 30 $job || fail "the run did not reach step 30"
    sleep 1.1  # the ranks' status files (their pids) are written
    if [ "$mode" = sigterm_nproc ]; then
      kill -TERM $job
    else
      kill -TERM "$(rank_pid "$work/run" 0)" "$(rank_pid "$work/run" 1)"
    fi
    wait_exit $job 60
    rc=$?
    [ $rc = 3 ] || fail "exit status $rc, expected 3 (interrupted): $(tail -5 "$work/cut.log")"
    s=$(sed -nE 's/.*training interrupted by .* after step ([0-9]+) of 100000.*/\1/p' "$work/cut.log")
    [ -n "$s" ] || fail "no 'training interrupted' line"
    [ -f "$work/run/checkpoint/step-$s/index.json" ] || fail "no checkpoint at the stop step $s"
    [ "$(fields "$work/run/metrics.jsonl" | tail -1 | cut -d' ' -f1)" = "$s" ] ||
      fail "the last logged step is not the stop step $s"
    end=$((s + 20))
    "$bin" "${common[@]}" --training.steps $end --nproc 2 --job.dump_folder "$work/run" \
      >"$work/resume.log" 2>&1 || fail "the resumed run failed: $(tail -3 "$work/resume.log")"
    grep -q "checkpoint: resumed from step $s " "$work/resume.log" || fail "did not resume from $s"
    "$bin" "${common[@]}" --training.steps $end --nproc 2 --job.dump_folder "$work/ref" \
      >"$work/ref.log" 2>&1 || fail "the uninterrupted run failed: $(tail -3 "$work/ref.log")"
    [ "$(fields "$work/run/metrics.jsonl")" = "$(fields "$work/ref/metrics.jsonl")" ] ||
      fail "the interrupted + resumed losses differ from the uninterrupted run"
    echo "ok ($mode): stopped after step $s with status 3, saved, resumed bitwise to step $end"
    ;;
  second_signal)
    # Rank 1 stalls at step 20 (so the first signal cannot end the step); rank 0 waits for it in a
    # collective. The first SIGINT is noted by both; the second ends them at once.
    "$bin" "${tiny[@]}" --nproc 2 --training.steps 100000 --checkpoint.enable true \
      --checkpoint.interval 1000 --debug.inject_stall_step 20 --debug.inject_stall_rank 1 \
      --comm.train_timeout_seconds 120 --job.dump_folder "$work/run" >"$work/run.log" 2>&1 &
    job=$!
    for _ in $(seq 600); do grep -q "stalling here" "$work/run.log" && break; sleep 0.05; done
    sleep 0.5
    kill -INT $job
    for _ in $(seq 600); do
      [ "$(grep -c 'stop signal received' "$work/run.log")" = 2 ] && break
      sleep 0.05
    done
    t0=$SECONDS
    kill -INT $job
    wait_exit $job 30
    rc=$?
    [ $rc != 0 ] && [ $rc != 3 ] && [ $rc != 4 ] || fail "exit status $rc after two signals (expected 128 + signal)"
    [ $((SECONDS - t0)) -le 5 ] || fail "took $((SECONDS - t0)) s after the second signal"
    grep -q "second stop signal: exiting now, without saving" "$work/run.log" ||
      fail "no 'second stop signal' line: $(tail -5 "$work/run.log")"
    for d in "$work"/run/checkpoint/step-*; do
      [ -e "$d" ] && { [ -f "$d/index.json" ] || fail "$d is there without its index"; }
    done
    echo "ok (second_signal): exit $rc at once after the second signal, no incomplete checkpoint"
    ;;
  nan_stop)
    common=("${tiny[@]}" --nproc 2 --training.steps 6 --checkpoint.enable true
      --checkpoint.interval 2 --checkpoint.last_save_model_only false)
    "$bin" "${common[@]}" --job.dump_folder "$work/ref" >"$work/ref.log" 2>&1 || fail "reference run failed"
    "$bin" "${common[@]}" --debug.inject_nan_step 3 --debug.inject_nan_rank 1 \
      --debug.find_nonfinite_gradient true --job.dump_folder "$work/run" >"$work/cut.log" 2>&1 &&
      fail "the run with a NaN exited 0"
    grep -q "step 3: the gradient norm is not finite (loss [0-9.]*, gradient norm nan); the first parameter with a non-finite gradient is tok_embeddings.weight. The update was not applied and the last checkpoint $work/run/checkpoint/step-2 is intact" \
      "$work/cut.log" || fail "no error naming step 3: $(grep meshtrain: "$work/cut.log")"
    [ -e "$work/run/checkpoint/step-4" ] && fail "a checkpoint after the NaN step"
    "$bin" "${common[@]}" --job.dump_folder "$work/run" >"$work/resume.log" 2>&1 || fail "resume failed"
    grep -q "checkpoint: resumed from step 2 " "$work/resume.log" || fail "did not resume from step 2"
    [ "$(fields "$work/run/metrics.jsonl" | tail -4)" = "$(fields "$work/ref/metrics.jsonl" | tail -4)" ] ||
      fail "steps 3..6 after resuming differ from the uninterrupted run"
    echo "ok (nan_stop): stopped at step 3 naming the parameter; step-2 resumed bitwise"
    ;;
  nan_skip)
    "$bin" "${tiny[@]}" --nproc 2 --training.steps 6 --training.skip_nonfinite_steps true \
      --debug.inject_nan_step 3 --debug.inject_nan_rank 1 --job.dump_folder "$work/run" \
      >"$work/run.log" 2>&1 || fail "the skipping run failed: $(tail -3 "$work/run.log")"
    [ "$(grep -c 'step 3: the gradient norm is not finite .*update skipped (1 in a row, 1 in all' "$work/run.log")" = 2 ] ||
      fail "both ranks must log the skip"
    grep -q '^step:  3 .*grad_norm: nan .*skipped steps: 1' "$work/run.log" || fail "no skip count in step 3's line"
    grep -q '"skipped_steps":1.0,"step":6' "$work/run/metrics.jsonl" || fail "metrics.jsonl lacks skipped_steps"
    fields "$work/run/metrics.jsonl" | sed -n 4,6p | grep -q 'null' && fail "non-finite after the skip"
    echo "ok (nan_skip): step 3 skipped on both ranks, counted, steps 4..6 finite"
    ;;
  eio_stop | enospc_continue)
    common=("${tiny[@]}" --nproc 2 --training.steps 12 --checkpoint.enable true
      --checkpoint.interval 4 --checkpoint.last_save_model_only false)
    ck=$work/run/checkpoint
    if [ "$mode" = eio_stop ]; then
      MESHTRAIN_CHECKPOINT_FAULT=eio@7:rank=1 "$bin" "${common[@]}" --job.dump_folder "$work/run" \
        >"$work/run.log" 2>&1 && fail "the run exited 0 after a failed save"
      grep -q "rank 1.*checkpoint: the save of step 8 failed: .*cannot write $ck/.step-8.tmp/rank-00001.safetensors: Input/output error.*its partial folder was removed and $ck/step-4 is intact" \
        "$work/run.log" || fail "no error naming the file: $(grep meshtrain: "$work/run.log")"
      [ -f "$ck/step-4/index.json" ] && [ ! -e "$ck/step-8" ] && [ ! -e "$ck/.step-8.tmp" ] ||
        fail "step-4 must stay, step-8 and its temporary folder must not: $(ls -a "$ck")"
      echo "ok (eio_stop): the run stopped naming the file; step-4 intact, nothing of step-8"
    else
      "$bin" "${common[@]}" --job.dump_folder "$work/ref" >"$work/ref.log" 2>&1 || fail "reference failed"
      MESHTRAIN_CHECKPOINT_FAULT=enospc@7:rank=0 "$bin" "${common[@]}" \
        --checkpoint.continue_on_save_error true --job.dump_folder "$work/run" >"$work/run.log" 2>&1 ||
        fail "the run stopped: $(grep meshtrain: "$work/run.log")"
      grep -q "checkpoint: the save of step 8 failed: .*rank-00000.safetensors: No space left on device.*training goes on" \
        "$work/run.log" || fail "no warning naming the file"
      [ -f "$ck/step-4/index.json" ] && [ -f "$ck/step-12/index.json" ] && [ ! -e "$ck/step-8" ] ||
        fail "expected step-4 and step-12 only: $(ls -a "$ck")"
      [ "$(fields "$work/run/metrics.jsonl")" = "$(fields "$work/ref/metrics.jsonl")" ] ||
        fail "the losses differ from the uninterrupted run"
      echo "ok (enospc_continue): step 8's save failed, training went on, step-12 saved, losses bitwise"
    fi
    ;;
  tmpfs_full)
    mnt=$work/small
    mkdir -p "$mnt"
    if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=1m tmpfs "$mnt" 2>"$work/mount.err"; then
      echo "SKIPPED (tmpfs_full): cannot mount a tmpfs here: $(cat "$work/mount.err" 2>/dev/null)"
      exit 77
    fi
    trap 'umount "$mnt"' EXIT
    "$bin" "${tiny[@]}" --nproc 2 --training.steps 12 --checkpoint.enable true --checkpoint.interval 4 \
      --checkpoint.last_save_model_only false --job.dump_folder "$mnt" >"$work/run.log" 2>&1 &&
      fail "the run exited 0 on a full disk"
    grep -q "checkpoint: the save of step 8 failed: .*cannot write $mnt/checkpoint/.step-8.tmp/rank-0000[01].safetensors: No space left on device" \
      "$work/run.log" || fail "no error naming the file: $(grep meshtrain: "$work/run.log")"
    [ -f "$mnt/checkpoint/step-4/index.json" ] && [ ! -e "$mnt/checkpoint/step-8" ] || fail "step-4 must stay alone"
    echo "ok (tmpfs_full): a real full disk stopped the run naming the file; step-4 intact"
    ;;
  data_replaced)
    "$bin" tokenize --dataset fortunes --output "$work/data.bin" >"$work/tok.log" 2>&1 || fail "tokenize failed"
    "$bin" "${tiny[@]}" --nproc 2 --training.steps 100000 --training.dataset tokens \
      --training.dataset_path "$work/data.bin" --job.dump_folder "$work/run" >"$work/run.log" 2>&1 &
    job=$!
    wait_steps "$work/run" 10 $job || fail "the run did not reach step 10: $(tail -3 "$work/run.log")"
    cp "$work/data.bin" "$work/new.bin" && mv "$work/new.bin" "$work/data.bin"
    wait_exit $job 60 && fail "the run went on with a replaced token file"
    grep -Eq "token file '$work/data.bin' was replaced during the run .* before reading byte offset [0-9]+" \
      "$work/run.log" || fail "no error naming the file and offset: $(grep meshtrain: "$work/run.log")"
    echo "ok (data_replaced): the run stopped naming the file and the offset"
    ;;
  *) fail "unknown mode" ;;
esac
