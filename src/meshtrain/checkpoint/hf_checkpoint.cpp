// Loading and saving a run's parameters in HF layout, every rank on its own pieces: host staging
// of one parameter at a time (device masters are copied through a host buffer), the ordering of a
// parallel save (create, write, sync, barrier, index, rename) and the replica ownership rule.
#include "meshtrain/checkpoint/hf_checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/hf_export.h"
#include "meshtrain/checkpoint/hf_io.h"
#include "meshtrain/checkpoint/save.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {

namespace fs = std::filesystem;

// The spellings are torch_dtype_name's ([checkpoint] export_dtype parses through the same names).
FileDType export_file_dtype(const std::string& d) {
  for (FileDType f : {FileDType::kF32, FileDType::kBF16, FileDType::kF16})
    if (d == torch_dtype_name(f)) return f;
  MT_THROW(ConfigError,
           "[checkpoint] export_dtype must be float32, bfloat16 or float16, found '{}'", d);
}

const char* torch_dtype_name(FileDType d) {
  switch (d) {
    case FileDType::kF32: return "float32";
    case FileDType::kBF16: return "bfloat16";
    case FileDType::kF16: return "float16";
    case FileDType::kF64: return "float64";
    default: return "unknown";
  }
}

namespace {

// A host copy of a device tensor (the tensor itself on the CPU backend).
Tensor to_host(const Tensor& t, Backend& backend) {
  if (t.device().is_cpu()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype(), backend.host_staging_allocator());
  backend.copy(h.raw(), t.raw(), t.nbytes(), CopyKind::kDeviceToHost, backend.stream(0));
  // Host sync: the staged copy is read on the host right after (saves only, never in a step).
  backend.synchronize();
  return h;
}

void barrier(const HfRunContext& run) {
  if (run.barrier) run.barrier();
}

}  // namespace

HfLoadReport load_hf_into_store(const std::string& folder, const HfRunContext& run) {
  HfFolder hf(folder);
  HfLoadReport rep;
  rep.notes = require_hf_config_match(hf.config(), run.model, run.seq_len, run.compute_dtype);
  HfLayout layout(run.model, run.plan.params());
  hf.check(layout, run.plan.config().master_dtype);
  for (const ParamInfo& p : run.plan.params()) {
    if (!layout.covers(p.name)) continue;
    Tensor dst = run.store.master(p.name);
    Tensor host = dst.device().is_cpu()
                      ? dst
                      : Tensor::empty(p.local_shape, p.dtype, run.backend.host_staging_allocator());
    read_hf_piece(hf, layout, p, host);
    if (!dst.device().is_cpu()) {
      run.backend.copy(dst.raw(), host.raw(), host.nbytes(), CopyKind::kHostToDevice,
                       run.backend.stream(0));
      // Host sync: the staging buffer is reused for the next parameter (start-up only).
      run.backend.synchronize();
    }
    ++rep.tensors;
  }
  // The masters changed under the compute copies: they are cast again before the next step.
  run.store.masters_written();
  rep.bytes_read = hf.bytes_read();
  rep.files = hf.files();
  return rep;
}

namespace {

// Rows of every parameter this rank owns into the files of `plan` in `dir` (rank 0 creates them
// first); every rank has synced its rows when this returns.
void write_rows(const std::string& dir, const HfRunContext& run, const HfLayout& layout,
                const HfShardPlan& plan, const std::vector<ParamInfo>& params, bool grads) {
  if (run.world_rank == 0) create_hf_files(plan, dir);
  barrier(run);  // the files exist before any rank writes rows
  {
    HfFileWriter w(plan, layout, dir);
    for (const ParamInfo& p : params) {
      if (!layout.covers(p.name) || !writes_piece(p, run.plan)) continue;
      Tensor t = grads ? run.store.grad(p.name) : run.store.master(p.name);
      write_hf_piece(w, layout, p, to_host(t, run.backend));
    }
    w.sync();
  }
  barrier(run);  // every rank's rows are on disk
}

}  // namespace

void write_hf_folder(const std::string& dir, const HfRunContext& run, FileDType dtype,
                     int64_t max_shard_bytes) {
  HfLayout layout(run.model, run.plan.params());
  HfShardPlan plan = plan_hf_shards(layout, dtype, max_shard_bytes);
  write_rows(dir, run, layout, plan, run.plan.params(), false);
  if (run.world_rank == 0) {
    bool bias_zero = true;
    for (const ParamInfo& p : run.plan.params()) {
      if (!layout.covers(p.name) || p.trainable) continue;
      Tensor h = to_host(run.store.master(p.name), run.backend);
      for (int64_t i = 0; i < h.numel(); ++i) bias_zero &= h.item_as_double(i) == 0.0;
    }
    write_hf_index(plan, layout,
                   hf_config_json(run.model, run.seq_len, run.compute_dtype,
                                  torch_dtype_name(dtype), bias_zero),
                   dir);
    sync_directory(dir);
  }
}

void save_hf_from_store(const std::string& folder, const HfRunContext& run,
                        const HfSaveOptions& o) {
  const bool grads = o.what == HfSaveWhat::kGradients;
  // Weights: the folder is built as "<folder>.tmp" and renamed. Gradients: one file, built as
  // "<file>.tmp" inside `folder` and renamed.
  const fs::path final_path = grads ? fs::path(folder) / o.gradients_file : fs::path(folder);
  const fs::path tmp = final_path.string() + ".tmp";
  if (run.world_rank == 0) {
    MT_CHECK_T(IoError, !fs::exists(final_path),
               "HF save: '{}' already exists (nothing is replaced)", final_path.string());
    if (fs::exists(tmp)) fs::remove_all(tmp);  // left by a save that died before its rename
    fs::create_directories(grads ? fs::path(folder) : tmp);
  }
  if (grads) {
    std::vector<ParamInfo> params;  // trainable parameters only (expert biases have none)
    for (const ParamInfo& p : run.plan.params())
      if (p.trainable) params.push_back(p);
    HfLayout layout(run.model, params, /*shared_copies=*/false);  // each gradient once
    HfShardPlan plan = plan_hf_shards(layout, o.dtype, std::numeric_limits<int64_t>::max());
    plan.files[0] = tmp.filename().string();
    write_rows(folder, run, layout, plan, params, true);
  } else {
    write_hf_folder(tmp.string(), run, o.dtype, o.max_shard_bytes);
  }
  if (run.world_rank == 0) {
    rename_no_replace(tmp.string(), final_path.string());
    sync_directory(final_path.parent_path().empty() ? "." : final_path.parent_path().string());
  }
  barrier(run);
}

}  // namespace meshtrain
