#!/usr/bin/env bash
# Measured peak memory of expert parallelism on the one GPU (issue 14.4): the DeepSeek-V3 16B
# flavor cut to 4 layers (64 experts, top-6) under FSDP 4 + EP 1, FSDP 4 + EP 4 at the default
# [parallelism] expert_capacity_factor, and FSDP 4 + EP 4 planned for the worst case (factor 4:
# the sizing before capacity planning). Four ranks share the GPU: each rank is its own NCCL node
# (NCCL_HOSTID) talking over loopback sockets, so speed is not representative; memory is per rank.
# Prints one line per layout: planned activations (meshtrain plan), measured peak of rank 0
# (the allocator's peak in the last step line) and how many expert exchanges overflowed the plan.
# Usage: scripts/gpu_ep_memory.sh [BUILD_DIR]   (default build-cuda; needs mpirun)
set -euo pipefail
build="${1:-build-cuda}"
bin="$build/meshtrain"
[ -x "$bin" ] || { echo "gpu_ep_memory: $bin not found (build the CUDA tree first)" >&2; exit 2; }
out="${OUT:-/tmp}/gpu_ep_memory"
# Four ranks of up to ~23 GiB each share the GPU; beside other GPU work they ran out of memory
# (seen next to the layout jobs), so refuse to start then (MESHTRAIN_EP_MEMORY_FORCE=1 overrides).
if command -v nvidia-smi > /dev/null && [ "${MESHTRAIN_EP_MEMORY_FORCE:-0}" != 1 ]; then
  used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' ')
  if [ "${used:-0}" -gt 4096 ]; then
    echo "gpu_ep_memory: GPU 0 already has ${used} MiB in use by other processes; the four ranks" \
         "need about 95 GiB of it. Run this alone (or set MESHTRAIN_EP_MEMORY_FORCE=1)." >&2
    exit 2
  fi
fi
mkdir -p "$out"
wrapper="$out/share_gpu.sh"
cat > "$wrapper" <<'WRAP'
#!/usr/bin/env bash
# One NCCL host identity per rank (several ranks on one GPU), loopback sockets only.
r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"
export NCCL_HOSTID="meshtrain-share-gpu-$r" NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0
export MESHTRAIN_SHARE_GPU=1
exec "$@"
WRAP
chmod +x "$wrapper"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
# Random tokens (as bench/e2e): no text corpus needed on the GPU machine, and routing near balance.
python3 bench/random_tokens.py "$out/random_tokens.bin" $((4 * 4097 * 64))
common=(--config configs/bench_deepseek_v3_16b_4l.toml --job.device cuda
        --training.dataset tokens --training.dataset_path "$out/random_tokens.bin"
        --training.local_batch_size 2 --training.seq_len 4096 --training.steps 6
        --metrics.log_freq 1 --parallelism.data_parallel_shard_degree 4)
printf "%-26s %-22s %-18s %s\n" layout "planned activations" "measured peak" "overflows"
for layout in "ep1 1 1.25" "ep4 4 1.25" "ep4_worst_case 4 4"; do
  read -r name ep cf <<<"$layout"
  args=("${common[@]}" --parallelism.expert_parallel_degree "$ep"
        --parallelism.expert_capacity_factor "$cf" --job.dump_folder "$out/$name")
  planned=$("$bin" plan "${args[@]}" | awk '/activations \(arena peak\)/ {print $4, $5}')
  log="$out/$name.log"
  mpirun --oversubscribe --bind-to none -np 4 "$wrapper" "$bin" train "${args[@]}" > "$log" 2>&1 || {
    echo "gpu_ep_memory: $name failed, see $log" >&2; tail -20 "$log" >&2; exit 1; }
  peak=$(grep -o 'memory: *[0-9.]*GiB' "$log" | tail -1 | grep -o '[0-9.]*GiB')
  overflows=$(grep -c 'received more rows than planned' "$log" || true)
  printf "%-26s %-22s %-18s %s\n" "FSDP4+EP$ep cf $cf" "$planned" "$peak" \
    "$overflows warning lines (all ranks, 6 steps)"
done
