#!/usr/bin/env bash
# Per-rank wrapper for several MPI ranks sharing one GPU (DESIGN.md, "Several ranks on one GPU"):
# each rank is its own NCCL "host" (NCCL_HOSTID), so NCCL talks over sockets on loopback instead
# of P2P/SHM/IB, which ranks of one device cannot use. Once MESHTRAIN_SHARE_GPU=1 lands (another
# helper adds it to the bootstrap) this wrapper is only the environment it sets.
# Usage: mpirun -np N scripts/share_gpu_rank.sh ./build-cuda/meshtrain train ...
set -euo pipefail
RANK=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
export MESHTRAIN_SHARE_GPU=1
export NCCL_HOSTID="meshtrain-share-gpu-rank-$RANK"
export NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
exec "$@"
