// Loading a checkpoint into this rank's shards, whatever mesh wrote it: each local tensor's real
// region is intersected with the stored slices of its global tensor, and only the byte ranges of
// the intersections are read (strided runs for multi-dim slices), converted to the master dtype.
// Rule: everything a user can get wrong (another model, a missing/extra tensor, a dtype that does
// not convert, a corrupted or truncated file, a checksum mismatch) is an error before training.
#pragma once

#include <string>

#include "meshtrain/checkpoint/index.h"
#include "meshtrain/optim/param_store.h"

namespace meshtrain {

// Reads and parses <dir>/index.json (IoError naming it when missing or corrupted).
CheckpointIndex read_checkpoint_index(const std::string& dir);

struct LoadStats {
  int64_t bytes_read = 0;      // tensor bytes this rank read for its shards
  int64_t bytes_verified = 0;  // bytes this rank checksummed (its share of the files)
  int files_read = 0, files_verified = 0;
  double seconds = 0;
};

// Checks that the checkpoint holds exactly this model's tensors (parameters and buffers, plus the
// optimizer moments when with_optimizer), with the same global shapes and convertible dtypes.
// Errors name the first offending tensor and the checkpoint.
void check_checkpoint_matches(const CheckpointIndex& ix, const std::string& dir,
                              const ParallelPlan& plan, bool with_optimizer);

// Verifies the CRC-32 and size of this rank's share of the files (file i on rank i % world), then
// fills every master (and the moments when with_optimizer) of `store` from the checkpoint.
// Padding is zero afterwards. Call check_checkpoint_matches first.
LoadStats load_checkpoint_tensors(const std::string& dir, const CheckpointIndex& ix,
                                  const ParallelPlan& plan, ParamStore& store, Backend& backend,
                                  bool with_optimizer, int rank, int world);

// Reads the whole global tensor `name` (every stored slice) into `out`, which holds the
// tensor's numel elements of dtype `to` (offline tools: conversion, inspection). Returns the
// bytes read.
int64_t read_global_tensor(const std::string& dir, const CheckpointIndex& ix,
                           const std::string& name, DType to, void* out);

}  // namespace meshtrain
