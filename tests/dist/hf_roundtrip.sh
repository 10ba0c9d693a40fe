#!/usr/bin/env bash
# HF export and import under real ranks (DeepSeek-V3 debug, 2 layers). The weights step 1 starts
# from are the seeded initialisation, the same on any layout: their HF dump ([debug] dump_step 1)
# written by 4 ranks (FSDP 2 + TP 2 + EP 2) must be byte for byte the 1-rank dump; that folder
# loaded with initial_load_in_hf on 4 ranks of another layout (HSDP 2x2 + EP 2) and dumped again
# must give the same bytes; and a last_save_in_hf written by those 4 ranks after a step, loaded on
# 1 rank and dumped, must come back byte for byte.
#   hf_roundtrip.sh MESHTRAIN CONFIG MPIRUN [MPIRUN ARGS...]   (the -np flag is added here)
set -eu -o pipefail
BIN=$1 CFG=$2
shift 2
MPI=("$@")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
common=(--config "$CFG" --model.n_layers 2 --training.seq_len 32 --training.local_batch_size 2
        --debug.dump_step 1 --job.device cpu --metrics.enable_jsonl false)
P=--parallelism
run() {  # name np args...
  local name=$1 np=$2
  shift 2
  if [ "$np" = 1 ]; then
    "$BIN" train "${common[@]}" --job.dump_folder "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  else
    "${MPI[@]}" -np "$np" "$BIN" train "${common[@]}" --job.dump_folder "$OUT/$name" "$@" \
      > "$OUT/$name.log" 2>&1
  fi || { echo "FAIL: run $name"; tail -20 "$OUT/$name.log"; exit 1; }
}
same() {  # folder folder what
  local f n=0
  for f in "$1"/*; do
    cmp -s "$f" "$2/$(basename "$f")" || { echo "FAIL: $3: $(basename "$f") differs"; exit 1; }
    n=$((n + 1))
  done
  [ "$n" -eq "$(ls "$2" | wc -l)" ] || { echo "FAIL: $3: the folders hold different files"; exit 1; }
  echo "ok: $3 ($n files identical)"
}
run one 1 --training.steps 1
run tp 4 --training.steps 1 $P.data_parallel_shard_degree 2 $P.tensor_parallel_degree 2 \
  $P.expert_parallel_degree 2
same "$OUT/one/debug/step-1/model" "$OUT/tp/debug/step-1/model" \
  "HF dump of FSDP 2 + TP 2 + EP 2 vs 1 rank"
run hsdp 4 --training.steps 1 $P.data_parallel_replicate_degree 2 $P.data_parallel_shard_degree 2 \
  $P.expert_parallel_degree 2 --checkpoint.enable true --checkpoint.last_save_in_hf true \
  --checkpoint.initial_load_path "$OUT/one/debug/step-1/model" --checkpoint.initial_load_in_hf true
same "$OUT/one/debug/step-1/model" "$OUT/hsdp/debug/step-1/model" \
  "loaded by HSDP 2x2 + EP 2 and dumped again"
run back 1 --training.steps 1 --checkpoint.enable true \
  --checkpoint.initial_load_path "$OUT/hsdp/checkpoint/step-1" --checkpoint.initial_load_in_hf true
same "$OUT/hsdp/checkpoint/step-1" "$OUT/back/debug/step-1/model" \
  "last_save_in_hf of 4 ranks loaded on 1 rank and dumped"
echo "HF ROUNDTRIP OK"
