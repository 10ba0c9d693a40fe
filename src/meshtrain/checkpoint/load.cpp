// Load with resharding: model check, this rank's share of the checksums, then per local tensor
// the intersections with the stored slices, read as byte ranges of memory-mapped files.
#include "meshtrain/checkpoint/load.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/checkpoint/save.h"

namespace meshtrain {

namespace fs = std::filesystem;

CheckpointIndex read_checkpoint_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / kIndexFile).string();
  MT_CHECK_T(IoError, fs::exists(path),
             "{} is not a complete checkpoint: it has no {} (a save that did not finish, or not a "
             "meshtrain checkpoint folder)",
             dir, kIndexFile);
  return CheckpointIndex::parse(read_text_file(path), path);
}

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

std::string and_more(size_t n) {
  return n > 1 ? fmt::format(" (and {} more)", n - 1) : std::string();
}
}  // namespace

void check_checkpoint_matches(const CheckpointIndex& ix, const std::string& dir,
                              const ParallelPlan& plan, bool with_optimizer) {
  MT_CHECK_T(ConfigError, !(with_optimizer && ix.model_only),
             "checkpoint {} holds only model weights (saved with last_save_model_only = true): it "
             "cannot restore the optimizer and training state; pick a full checkpoint with "
             "[checkpoint] load_step, or load it as initial weights with initial_load_path and "
             "initial_load_model_only = true",
             dir);
  const std::vector<CheckpointTensor> want = checkpoint_tensors(plan, !with_optimizer);
  std::set<std::string> names;
  std::vector<std::string> missing;
  for (const CheckpointTensor& w : want) {
    names.insert(w.name);
    const StoredTensor* t = ix.find(w.name);
    if (!t) {
      missing.push_back(w.name);
      continue;
    }
    MT_CHECK_T(ValueError, t->shape == w.param->global_shape.dims(),
               "checkpoint {} does not fit this model (another model or flavor?): tensor {} has "
               "shape {} in the checkpoint and {} in this model",
               dir, w.name, shape_str(t->shape), shape_str(w.param->global_shape.dims()));
    MT_CHECK_T(ValueError, can_convert_from_file(t->dtype, w.param->dtype),
               "checkpoint {}: tensor {} is stored as {}, which cannot be converted to this run's "
               "{}",
               dir, w.name, file_dtype_name(t->dtype), dtype_name(w.param->dtype));
  }
  MT_CHECK_T(ValueError, missing.empty(),
             "checkpoint {} lacks tensor {}{}, which this model has (another model or flavor, or "
             "an incomplete index?)",
             dir, missing.empty() ? "" : missing[0], and_more(missing.size()));
  std::vector<std::string> extra;
  for (const StoredTensor& t : ix.tensors) {
    const bool optimizer_state = t.name.rfind("optimizer.", 0) == 0;
    if (!names.count(t.name) && (with_optimizer || !optimizer_state)) extra.push_back(t.name);
  }
  MT_CHECK_T(ValueError, extra.empty(),
             "checkpoint {} holds tensor {}{}, which this model does not have (another model or "
             "flavor?)",
             dir, extra.empty() ? "" : extra[0], and_more(extra.size()));
}

LoadStats load_checkpoint_tensors(const std::string& dir, const CheckpointIndex& ix,
                                  const ParallelPlan& plan, ParamStore& store, Backend& backend,
                                  bool with_optimizer, int rank, int world) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadStats st;
  // Every file is checksummed once across the job: file i by rank i % world.
  for (size_t i = 0; i < ix.files.size(); ++i) {
    if (int(i % size_t(world)) != rank) continue;
    const StoredFile& f = ix.files[i];
    const std::string path = (fs::path(dir) / f.name).string();
    int64_t size = 0;
    const uint32_t crc = file_crc32(path, &size);
    MT_CHECK_T(IoError, size == f.bytes,
               "{} has {} bytes, the checkpoint index says {} (truncated or replaced?)", path, size,
               f.bytes);
    MT_CHECK_T(IoError, crc == f.crc32,
               "checksum mismatch in {}: the checkpoint index records CRC-32 {}, the file has {} "
               "(the file was modified or corrupted)",
               path, crc32_hex(f.crc32), crc32_hex(crc));
    st.bytes_verified += size;
    ++st.files_verified;
  }
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  auto reader = [&](const std::string& name) -> SafetensorsReader& {
    auto it = readers.find(name);
    if (it != readers.end()) return *it->second;
    const std::string path = (fs::path(dir) / name).string();
    auto r = std::make_unique<SafetensorsReader>(path);
    const StoredFile* f = ix.file(name);
    MT_CHECK_T(IoError, f && r->file_size() == f->bytes,
               "{} has {} bytes, the checkpoint index says {} (truncated or replaced?)", path,
               r->file_size(), f ? f->bytes : -1);
    return *readers.emplace(name, std::move(r)).first->second;
  };
  std::vector<char> buf(size_t(4) << 20);
  Stream& stream = backend.stream(0);
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors(plan, !with_optimizer);
  // Device backends: one host buffer (the largest local tensor), reused by every tensor.
  Tensor staging;
  if (!backend.device().is_cpu()) {
    size_t most = 8;
    for (const CheckpointTensor& ct : tensors)
      most = std::max(most, size_t(ct.param->local_shape.numel()) * dtype_size(ct.param->dtype));
    staging = Tensor::empty(Shape{int64_t((most + 7) / 8)}, DType::kI64,
                            backend.host_staging_allocator());
  }
  for (const CheckpointTensor& ct : tensors) {
    const ParamInfo& p = *ct.param;
    const StoredTensor& t = *ix.find(ct.name);
    const Tensor dev = !ct.optimizer                     ? store.master(p.name)
                       : ct.name == exp_avg_name(p.name) ? store.exp_avg(p.name)
                                                         : store.exp_avg_sq(p.name);
    const bool on_host = dev.device().is_cpu();
    const Tensor host =
        on_host ? dev : Tensor(staging.storage(), staging.byte_offset(), dev.shape(), dev.dtype());
    std::memset(host.raw(), 0, host.nbytes());  // padding reads zero
    const Box region = real_region(p), local = shard_box(p);
    const size_t esize = dtype_size(p.dtype), fsize = file_dtype_size(t.dtype);
    const bool same = dtype_of_file(t.dtype) == p.dtype;
    char* base = static_cast<char*>(host.raw());
    int64_t covered = 0;
    for (const StoredSlice& s : t.slices) {
      const Box part = intersect(region, s.box);
      if (part.empty()) continue;
      covered += part.volume();
      SafetensorsReader& r = reader(s.file);
      const SafetensorsEntry& e = r.at(t.name);
      MT_CHECK_T(IoError,
                 e.dtype == t.dtype && e.shape == s.box.ext && e.begin == s.begin && e.end == s.end,
                 "{}: its header and the checkpoint index disagree on tensor {} ({} {} at bytes "
                 "[{}, {}) vs {} {} at [{}, {}]): one of them is corrupted",
                 r.path(), t.name, file_dtype_name(e.dtype), shape_str(e.shape), e.begin, e.end,
                 file_dtype_name(t.dtype), shape_str(s.box.ext), s.begin, s.end);
      for_each_run(part, s.box, local.ext, local, [&](int64_t a, int64_t b, int64_t n) {
        char* dst = base + size_t(b) * esize;
        if (same) {
          r.read_range(e, a * int64_t(fsize), n * int64_t(fsize), dst);
          return;
        }
        while (n > 0) {
          const int64_t k = std::min<int64_t>(n, int64_t(buf.size() / fsize));
          r.read_range(e, a * int64_t(fsize), k * int64_t(fsize), buf.data());
          convert_from_file(t.dtype, buf.data(), p.dtype, dst, k, t.name);
          a += k, n -= k, dst += size_t(k) * esize;
        }
      });
    }
    MT_CHECK(covered == region.volume(), "{}: the slices of {} cover {} of the {} elements of {}",
             dir, t.name, covered, region.volume(), region.to_string());
    if (!on_host) {
      backend.copy(dev.raw(), host.raw(), host.nbytes(), CopyKind::kHostToDevice, stream);
      // Host wait (start-up only): the staging buffer is reused by the next tensor.
      stream.synchronize();
    }
  }
  // The masters changed under the compute copies: they are cast again before the next step.
  store.masters_written();
  for (const auto& [name, r] : readers) st.bytes_read += r->bytes_read();
  st.files_read = int(readers.size());
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

int64_t read_global_tensor(const std::string& dir, const CheckpointIndex& ix,
                           const std::string& name, DType to, void* out) {
  const StoredTensor* t = ix.find(name);
  MT_CHECK_T(ValueError, t != nullptr, "checkpoint {} holds no tensor {}", dir, name);
  MT_CHECK_T(ValueError, can_convert_from_file(t->dtype, to),
             "checkpoint {}: tensor {} is stored as {}, which cannot be converted to {}", dir, name,
             file_dtype_name(t->dtype), dtype_name(to));
  const Box whole{std::vector<int64_t>(t->shape.size(), 0), t->shape};
  const size_t esize = dtype_size(to), fsize = file_dtype_size(t->dtype);
  int64_t bytes = 0;
  std::vector<char> buf;
  for (const StoredSlice& s : t->slices) {
    if (s.box.empty()) continue;
    const SafetensorsReader r((fs::path(dir) / s.file).string());
    const SafetensorsEntry& e = r.at(name);
    MT_CHECK_T(IoError, e.begin == s.begin && e.end == s.end,
               "{}: its header and the checkpoint index disagree on tensor {}", r.path(), name);
    for_each_run(s.box, s.box, whole.ext, whole, [&](int64_t a, int64_t b, int64_t n) {
      buf.resize(size_t(n) * fsize);
      r.read_range(e, a * int64_t(fsize), n * int64_t(fsize), buf.data());
      convert_from_file(t->dtype, buf.data(), to, static_cast<char*>(out) + size_t(b) * esize, n,
                        name);
    });
    bytes += r.bytes_read();
  }
  return bytes;
}

}  // namespace meshtrain
