#!/usr/bin/env bash
# The NCCL variants of issue 16's faults, for the GPU machine: 2 ranks on one GPU (each rank its
# own NCCL "host" over loopback sockets), llama3 debug tiny on [job] device cuda.
#   stall      rank 1 stalls at step 4: rank 0's NCCL watchdog ends it with the timeout error naming
#              the collective and communicator ([comm] train_timeout_seconds = 20), within 90 s
#   lost       rank 1 gets SIGKILL mid-run: every rank is gone within 60 s, non-zero; mpirun names
#              rank 1
#   nan_stop   a NaN gradient on rank 1 at step 3: the run stops naming step 3
#   nan_skip   the same with skip_nonfinite_steps: both ranks skip step 3 (the CUDA AdamW kernel's
#              early return), later steps finite
#   sigterm    SIGTERM to both ranks: they stop after the same step, save it, exit 3
#
#   scripts/gpu_faults.sh [MODE...]      (default: all five; needs build-cuda/meshtrain, and
#                                         build-cuda/bundle from `scripts/gpu_test.sh bundle`)
# MESHTRAIN_FAULT_DEVICE=cpu MESHTRAIN_BIN=build/meshtrain runs the same modes on CPU ranks (a dry
# run of this script where no GPU is). Carry: build-cuda/meshtrain and build-cuda/bundle. Prints "ok (MODE)" or "FAIL (MODE)" per mode
# and "gpu_faults: N passed, M failed"; logs under $OUT (or ./gpu_faults_out).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MESHTRAIN_BIN:-$ROOT/build-cuda/meshtrain}

if [ "${1:-}" = "__rank__" ]; then
  # One rank: its own NCCL host id, sockets over loopback, no P2P/SHM/IB/NVLS, the one GPU.
  shift
  r=${OMPI_COMM_WORLD_RANK:-0}
  export NCCL_HOSTID="meshtrain-fault-rank-$r" NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0
  export MESHTRAIN_SHARE_GPU=1 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1
  exec "$@"
fi

[ -x "$BIN" ] || { echo "gpu_faults.sh: $BIN not found: build it (ninja -C build-cuda meshtrain) and carry it" >&2; exit 2; }
OUT=${OUT:-$ROOT/gpu_faults_out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export LD_LIBRARY_PATH="$ROOT/build-cuda/bundle:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in $(python3 -c 'import glob,site;print(" ".join(d for s in site.getsitepackages() for d in glob.glob(s+"/nvidia/*/lib")))' 2>/dev/null); do
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
if ldd "$BIN" | grep -q "not found"; then
  echo "gpu_faults.sh: libraries not found: $(ldd "$BIN" | grep 'not found' | tr '\n' ' ')" >&2
  exit 2
fi

launch=(mpirun --oversubscribe --bind-to none -np 2 -x LD_LIBRARY_PATH "$0" __rank__ "$BIN")
# The text dataset over a file of the checkout: GPU images have no fortunes corpus.
tiny=(train --config "$ROOT/configs/llama3_debug.toml" --job.device "${MESHTRAIN_FAULT_DEVICE:-cuda}" --model.flavor tiny
  --training.dataset text --training.dataset_path "$ROOT/ARCHITECTURE.md"
  --training.seq_len 32 --training.local_batch_size 2 --metrics.log_freq 1)
passed=0 failed=0
result() {
  if [ "$1" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  echo "$1 ($2): $3"
}
wait_steps() {  # DIR STEPS JOB: until the run logged STEPS steps; fails at once if JOB ended
  for _ in $(seq 1200); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l <"$1/metrics.jsonl")" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

run_mode() {
  local mode=$1 w=$OUT/$1 t0=$SECONDS rc
  rm -rf "$w" && mkdir -p "$w"
  case $mode in
    stall)
      timeout 120 "${launch[@]}" "${tiny[@]}" --training.steps 100 --debug.inject_stall_step 4 \
        --debug.inject_stall_rank 1 --comm.train_timeout_seconds 20 --job.dump_folder "$w" \
        >"$w/log" 2>&1
      rc=$?
      if [ $rc != 0 ] && [ $rc != 124 ] && [ $((SECONDS - t0)) -lt 90 ] &&
        grep -q "did not complete.*train_timeout_seconds = 20" "$w/log"; then
        result ok stall "exit $rc after $((SECONDS - t0)) s: $(grep 'did not complete' "$w/log" | head -1 | cut -c1-240)"
      else
        result FAIL stall "exit $rc after $((SECONDS - t0)) s; see $w/log: $(grep 'meshtrain:' "$w/log" | head -2)"
      fi
      ;;
    lost)
      "${launch[@]}" "${tiny[@]}" --training.steps 100000 --job.dump_folder "$w" >"$w/log" 2>&1 &
      local job=$!
      wait_steps "$w" 20 $job && sleep 1.2
      kill -KILL "$(cut -d' ' -f2 "$w/.ranks/rank-1")"
      local t1=$SECONDS
      while kill -0 $job 2>/dev/null && [ $((SECONDS - t1)) -lt 90 ]; do sleep 0.2; done
      kill -0 $job 2>/dev/null && kill -KILL $job
      wait $job
      rc=$?
      # Named by rank 0 (NCCL's error with the peer's status file) or by mpirun, whichever is first.
      if [ $rc != 0 ] && [ $((SECONDS - t1)) -le 60 ] &&
        grep -q "rank 1 (pid [0-9]* on .*) is gone\|rank 1 .* exited on signal 9" "$w/log"; then
        result ok lost "every rank gone $((SECONDS - t1)) s after the kill (exit $rc): $(grep -h 'meshtrain: \[rank 0\]\|meshtrain: rank 0' "$w/log" | head -1 | cut -c1-400)"
      else
        result FAIL lost "exit $rc, $((SECONDS - t1)) s after the kill; see $w/log"
      fi
      ;;
    nan_stop | nan_skip)
      local extra=()
      [ $mode = nan_skip ] && extra=(--training.skip_nonfinite_steps true)
      "${launch[@]}" "${tiny[@]}" --training.steps 6 --debug.inject_nan_step 3 \
        --debug.inject_nan_rank 1 "${extra[@]+"${extra[@]}"}" --job.dump_folder "$w" >"$w/log" 2>&1
      rc=$?
      if [ $mode = nan_stop ] && [ $rc != 0 ] && grep -q "step 3: the gradient norm is not finite" "$w/log"; then
        result ok nan_stop "stopped at step 3 (exit $rc)"
      elif [ $mode = nan_skip ] && [ $rc = 0 ] &&
        [ "$(grep -c 'step 3: .*update skipped' "$w/log")" = 2 ] && grep -q '^step:  6 .*skipped steps: 1' "$w/log" &&
        ! grep -q '^step:  [456] .*nan' "$w/log"; then
        result ok nan_skip "step 3 skipped on both ranks, steps 4..6 finite"
      else
        result FAIL $mode "exit $rc; see $w/log"
      fi
      ;;
    sigterm)
      "${launch[@]}" "${tiny[@]}" --training.steps 100000 --checkpoint.enable true \
        --checkpoint.interval 100000 --job.dump_folder "$w" >"$w/log" 2>&1 &
      local job=$!
      wait_steps "$w" 20 $job && sleep 1.2
      kill -TERM "$(cut -d' ' -f2 "$w/.ranks/rank-0")" "$(cut -d' ' -f2 "$w/.ranks/rank-1")"
      wait $job
      rc=$?
      local s
      s=$(sed -nE 's/.*training interrupted by .* after step ([0-9]+) of .*/\1/p' "$w/log" | head -1)
      if [ $rc = 3 ] && [ -n "$s" ] && [ -f "$w/checkpoint/step-$s/index.json" ]; then
        result ok sigterm "stopped after step $s, step-$s saved, exit 3"
      else
        result FAIL sigterm "exit $rc, stop step '$s'; see $w/log"
      fi
      ;;
    *) result FAIL "$mode" "unknown mode" ;;
  esac
}

modes=("$@")
[ ${#modes[@]} = 0 ] && modes=(stall lost nan_stop nan_skip sigterm)
for m in "${modes[@]}"; do run_mode "$m"; done
echo "gpu_faults: $passed passed, $failed failed (logs in $OUT)"
[ $failed = 0 ]
