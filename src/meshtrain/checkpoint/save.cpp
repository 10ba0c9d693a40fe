// Save: the snapshot (what this rank writes, staged to host), the rank's file and manifest, and
// rank 0's finalisation. The data of a tensor is written as its real region, row-major, converted
// through one bounded buffer, so file order is region order and nothing else is materialised.
#include "meshtrain/checkpoint/save.h"

#include <chrono>
#include <filesystem>
#include <map>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/safetensors.h"

namespace meshtrain {

namespace fs = std::filesystem;

std::string exp_avg_name(const std::string& param) {
  return "optimizer.state." + param + ".exp_avg";
}
std::string exp_avg_sq_name(const std::string& param) {
  return "optimizer.state." + param + ".exp_avg_sq";
}

std::vector<CheckpointTensor> checkpoint_tensors(const ParallelPlan& plan, bool model_only) {
  std::vector<CheckpointTensor> out;
  for (const ParamInfo& p : plan.params()) out.push_back({p.name, &p, false});
  if (!model_only)
    for (const ParamInfo& p : plan.params())
      if (p.trainable) {
        out.push_back({exp_avg_name(p.name), &p, true});
        out.push_back({exp_avg_sq_name(p.name), &p, true});
      }
  return out;
}

std::vector<std::string> checkpoint_tensor_names(const ParallelPlan& plan, bool model_only) {
  std::vector<std::string> names;
  for (const CheckpointTensor& t : checkpoint_tensors(plan, model_only)) names.push_back(t.name);
  return names;
}

bool writes_piece(const ParamInfo& p, const ParallelPlan& plan) {
  if (p.shard_degree == 1) return plan.group_rank(MeshGroup::kWorld) == 0;
  for (const auto& [group, placement] : p.placements)
    if (!placement.is_shard() && plan.group_rank(group) != 0) return false;
  return true;
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Snapshot::Snapshot(const ParallelPlan& plan, const ParamStore& store, Backend& backend, bool staged)
    : backend_(backend), staged_(staged) {
  for (const ParamInfo& p : plan.params()) {
    const Box region = real_region(p);
    if (!writes_piece(p, plan) || region.empty()) continue;
    items_.push_back({p.name, &p, store.master(p.name), {}, region, false});
    if (p.trainable) {
      items_.push_back({exp_avg_name(p.name), &p, store.exp_avg(p.name), {}, region, true});
      items_.push_back({exp_avg_sq_name(p.name), &p, store.exp_avg_sq(p.name), {}, region, true});
    }
  }
  if (!staged_) {
    for (SnapshotItem& it : items_) {
      MT_CHECK(it.source.device().is_cpu(), "an unstaged snapshot needs host tensors ({})",
               it.name);
      it.host = it.source;
    }
    return;
  }
  // Host memory for the copies: one allocation (pinned on device backends), made here, once,
  // outside any step; every item a 256-byte aligned view of it.
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const SnapshotItem& it : items_) {
    offsets.push_back(total);
    total += (it.source.nbytes() + 255) / 256 * 256;
  }
  const Tensor arena = Tensor::empty(Shape{int64_t(std::max<size_t>(total, 8) / 8)}, DType::kI64,
                                     backend.host_staging_allocator());
  for (size_t i = 0; i < items_.size(); ++i)
    items_[i].host = Tensor(arena.storage(), arena.byte_offset() + offsets[i],
                            items_[i].source.shape(), items_[i].source.dtype());
  staged_bytes_ = int64_t(total);
}

void Snapshot::take(bool model_only) {
  if (!staged_) return;
  // Host wait: the step's work on every stream must be done before its results are copied.
  backend_.synchronize();
  Stream& s = backend_.stream(0);
  for (const SnapshotItem& it : items_)
    if (!(model_only && it.optimizer))
      backend_.copy(it.host.raw(), it.source.raw(), it.source.nbytes(), CopyKind::kDeviceToHost, s);
  // Host wait: the snapshot is the one stall a save puts on the step loop.
  s.synchronize();
}

RankManifest write_rank_part(const std::string& dir, int rank, const Snapshot& snap,
                             bool model_only, std::optional<FileDType> export_dtype,
                             const LoaderPosition& loader, int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  RankManifest m;
  m.rank = rank;
  m.loader = loader;
  std::vector<const SnapshotItem*> items;
  for (const SnapshotItem& it : snap.items())
    if (!(model_only && it.optimizer)) items.push_back(&it);
  if (!items.empty()) {
    const std::string fname = rank_file_name(rank);
    SafetensorsWriter w((fs::path(dir) / fname).string());
    auto file_dtype = [&](const SnapshotItem& it) {
      return export_dtype.value_or(file_dtype_of(it.host.dtype()));
    };
    for (const SnapshotItem* it : items) w.add(it->name, file_dtype(*it), it->region.ext);
    w.set_metadata("format", "meshtrain");
    w.set_metadata("step", std::to_string(step));
    w.set_metadata("rank", std::to_string(rank));
    // Runs go out through one bounded buffer (converted on the way when the dtypes differ);
    // runs larger than the buffer in the tensor's own dtype are written straight from memory.
    std::vector<char> buf(size_t(8) << 20);
    size_t used = 0;
    auto flush = [&] {
      if (used) w.write(buf.data(), used);
      used = 0;
    };
    for (const SnapshotItem* it : items) {
      const FileDType fdt = file_dtype(*it);
      const DType dt = it->host.dtype();
      const size_t esize = dtype_size(dt), fsize = file_dtype_size(fdt);
      const bool same = dtype_of_file(fdt) == dt;
      const char* base = static_cast<const char*>(it->host.raw());
      const Box local = shard_box(*it->param);
      for_each_run(it->region, it->region, local.ext, local, [&](int64_t, int64_t b, int64_t n) {
        const char* src = base + size_t(b) * esize;
        if (same && size_t(n) * fsize >= buf.size()) {
          flush();
          w.write(src, size_t(n) * fsize);
          return;
        }
        while (n > 0) {
          const int64_t k = std::min<int64_t>(n, int64_t((buf.size() - used) / fsize));
          if (k == 0) {
            flush();
            continue;
          }
          convert_to_file(dt, src, fdt, buf.data() + used, k, it->name);
          used += size_t(k) * fsize, src += size_t(k) * esize, n -= k;
        }
      });
    }
    flush();
    const SafetensorsWritten r = w.finish();
    m.file = StoredFile{fname, rank, r.bytes, r.crc32};
    for (size_t i = 0; i < items.size(); ++i) {
      const SafetensorsEntry& e = w.entries()[i];
      const ParamInfo& p = *items[i]->param;
      m.tensors.push_back(StoredTensor{items[i]->name,
                                       e.dtype,
                                       p.global_shape.dims(),
                                       {StoredSlice{fname, items[i]->region, e.begin, e.end}}});
    }
  }
  m.write_seconds = seconds_since(t0);
  // The manifest marks this rank's part complete: it appears whole, by rename.
  const std::string final_path = (fs::path(dir) / manifest_name(rank)).string();
  write_file_durably(final_path + ".tmp", m.to_json());
  rename_no_replace(final_path + ".tmp", final_path);
  return m;
}

bool rank_parts_complete(const std::string& dir, int world) {
  for (int r = 0; r < world; ++r)
    if (!fs::exists(fs::path(dir) / manifest_name(r))) return false;
  return true;
}

CheckpointIndex finalize_checkpoint(const std::string& tmp_dir, const std::string& final_dir,
                                    int world, CheckpointIndex head,
                                    const std::vector<std::string>& order, double* write_seconds) {
  std::map<std::string, StoredTensor> by_name;
  std::map<int64_t, LoaderPosition> loaders;
  head.files.clear();
  for (int r = 0; r < world; ++r) {
    const std::string path = (fs::path(tmp_dir) / manifest_name(r)).string();
    MT_CHECK_T(IoError, fs::exists(path),
               "checkpoint {}: rank {} did not complete its part ({} is missing; is the "
               "checkpoint folder on a filesystem every rank shares?)",
               final_dir, r, path);
    RankManifest m = RankManifest::parse(read_text_file(path), path);
    if (write_seconds) *write_seconds = std::max(*write_seconds, m.write_seconds);
    if (!m.file.name.empty()) {
      const fs::path f = fs::path(tmp_dir) / m.file.name;
      std::error_code ec;
      const auto size = fs::file_size(f, ec);
      MT_CHECK_T(IoError, !ec && int64_t(size) == m.file.bytes,
                 "checkpoint {}: {} has {} bytes, its rank's manifest says {}", final_dir,
                 f.string(), ec ? -1 : int64_t(size), m.file.bytes);
      head.files.push_back(m.file);
    }
    for (StoredTensor& t : m.tensors) {
      auto [it, fresh] = by_name.try_emplace(t.name, t);
      if (fresh) continue;
      MT_CHECK(it->second.dtype == t.dtype && it->second.shape == t.shape,
               "ranks disagree on tensor {}", t.name);
      for (StoredSlice& s : t.slices) it->second.slices.push_back(std::move(s));
    }
    auto [l, fresh] = loaders.try_emplace(m.loader.dp_rank, m.loader);
    MT_CHECK(fresh || (l->second.step == m.loader.step &&
                       l->second.next_window == m.loader.next_window &&
                       l->second.micro_batch == m.loader.micro_batch),
             "ranks of dp rank {} disagree on the loader position", m.loader.dp_rank);
  }
  head.tensors.clear();
  for (const std::string& name : order) {
    auto it = by_name.find(name);
    MT_CHECK(it != by_name.end(), "checkpoint {}: no rank wrote tensor {}", final_dir, name);
    check_tiling(it->second, final_dir);
    head.tensors.push_back(std::move(it->second));
    by_name.erase(it);
  }
  MT_CHECK(by_name.empty(), "checkpoint {}: tensor {} is not part of the model", final_dir,
           by_name.begin()->first);
  head.state.loader.clear();
  for (auto& [dp, l] : loaders) head.state.loader.push_back(l);
  MT_CHECK(int64_t(head.state.loader.size()) == head.state.dp_degree,
           "checkpoint {}: loader positions of {} dp ranks, expected {}", final_dir,
           head.state.loader.size(), head.state.dp_degree);
  write_file_durably((fs::path(tmp_dir) / kIndexFile).string(), head.to_json());
  sync_directory(tmp_dir);
  rename_no_replace(tmp_dir, final_dir);
  sync_directory(fs::path(final_dir).parent_path().string());
  return head;
}

}  // namespace meshtrain
