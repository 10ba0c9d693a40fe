#!/usr/bin/env bash
# checkpoint_fault.sh MODE BIN CONFIG WORKDIR: a 2-rank run saving every 4 steps whose save at step
# 8 dies (MODE kill: rank 1 gets SIGKILL half-way through writing its file; kill_async: the same
# in the background writer of an async save; enospc: rank 0's write fails with ENOSPC) leaves
# step-4 loadable and no step-8; the same command run again resumes from step 4 without flags and
# logs for steps 5..12 exactly the losses and gradient norms of an uninterrupted run.
set -u
mode=$1 bin=$2 cfg=$3 work=$4
fail() {
  echo "FAIL ($mode): $*"
  exit 1
}
rm -rf "$work" && mkdir -p "$work"
common=(train --config "$cfg" --model.flavor tiny --training.seq_len 32
  --training.local_batch_size 2 --training.steps 12 --metrics.log_freq 1 --nproc 2
  --checkpoint.enable true --checkpoint.interval 4 --checkpoint.last_save_model_only false)
extra=(--checkpoint.async_mode disabled)
case $mode in
  kill) fault="kill@7:rank=1" ;;
  kill_async) fault="kill@7:rank=1" extra=(--checkpoint.async_mode async) ;;
  enospc) fault="enospc@7:rank=0" ;;
  *) fail "unknown mode" ;;
esac
ck=$work/run/checkpoint

"$bin" "${common[@]}" "${extra[@]}" --job.dump_folder "$work/ref" >"$work/ref.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -5 "$work/ref.log")"

MESHTRAIN_CHECKPOINT_FAULT=$fault "$bin" "${common[@]}" "${extra[@]}" \
  --job.dump_folder "$work/run" >"$work/cut.log" 2>&1 && fail "the run with the fault exited 0"
[ -f "$ck/step-4/index.json" ] || fail "step-4 is not a complete checkpoint"
[ -e "$ck/step-8" ] && fail "step-8 exists after its save died"
if [ "$mode" = enospc ]; then
  grep -q "cannot write $ck/.step-8.tmp/rank-00000.safetensors: No space left on device" \
    "$work/cut.log" || fail "no error naming the file: $(grep 'meshtrain:' "$work/cut.log")"
else
  grep -q "SIGKILL in $ck/.step-8.tmp/rank-00001.safetensors" "$work/cut.log" ||
    fail "rank 1 was not killed while writing its file: $(tail -5 "$work/cut.log")"
fi

"$bin" "${common[@]}" "${extra[@]}" --job.dump_folder "$work/run" >"$work/resume.log" 2>&1 ||
  fail "the resumed run failed: $(tail -5 "$work/resume.log")"
grep -q "checkpoint: resumed from step 4 of $ck/step-4 " "$work/resume.log" ||
  fail "the run did not resume from step 4: $(grep 'checkpoint' "$work/resume.log")"
for s in 8 12; do [ -f "$ck/step-$s/index.json" ] || fail "step-$s was not saved after resuming"; done
[ -e "$ck/.step-8.tmp" ] && fail "the dead save's temporary folder is still there"

# metrics.jsonl (full precision): the resumed run appended steps 5..12 after the dead run's lines.
fields() { sed -E 's/.*"grad_norm":([^,]*),"loss":([^,]*),.*"step":([0-9]+),.*/\3 \2 \1/' "$1" | tail -8; }
want=$(fields "$work/ref/metrics.jsonl")
got=$(fields "$work/run/metrics.jsonl")
[ "$(echo "$got" | head -1 | cut -d' ' -f1)" = 5 ] || fail "the resumed run's first logged step is not 5"
[ "$got" = "$want" ] || fail "steps 5..12 differ from the uninterrupted run:
got:
$got
want:
$want"
echo "ok ($mode): step-8 died, step-4 stayed loadable, the resumed run matches bitwise"
