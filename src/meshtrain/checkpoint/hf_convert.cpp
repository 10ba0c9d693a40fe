// Offline conversion: a box reader over a checkpoint's stored slices (the source of an HF export),
// and the HF -> checkpoint direction, which writes the rank-file format of a save (files of at most
// max_shard_bytes as the parts of virtual ranks, their manifests, then the one finalisation).
#include "meshtrain/checkpoint/hf_convert.h"

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/checkpoint/hf_config.h"
#include "meshtrain/checkpoint/hf_io.h"
#include "meshtrain/checkpoint/load.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/checkpoint/save.h"
#include "meshtrain/core/logging.h"

namespace meshtrain {

namespace fs = std::filesystem;

struct CheckpointSource::Impl {
  std::string dir;
  const CheckpointIndex& ix;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  std::vector<char> buf = std::vector<char>(size_t(4) << 20);
  SafetensorsReader& reader(const std::string& file) {
    auto& r = readers[file];
    if (!r) r = std::make_unique<SafetensorsReader>((fs::path(dir) / file).string());
    return *r;
  }
};

CheckpointSource::CheckpointSource(std::string dir, const CheckpointIndex& index)
    : impl_(new Impl{std::move(dir), index, {}}) {}
CheckpointSource::~CheckpointSource() = default;

int64_t CheckpointSource::bytes_read() const {
  int64_t b = 0;
  for (const auto& [n, r] : impl_->readers) b += r->bytes_read();
  return b;
}

void CheckpointSource::read_box(const std::string& name, const std::vector<int64_t>& begin,
                                const std::vector<int64_t>& count, DType to, void* dst) {
  const StoredTensor* t = impl_->ix.find(name);
  MT_CHECK_T(ValueError, t != nullptr, "checkpoint {} has no tensor {}", impl_->dir, name);
  const Box want{begin, count};
  const size_t es = dtype_size(to), fs_ = file_dtype_size(t->dtype);
  int64_t covered = 0;
  for (const StoredSlice& s : t->slices) {
    const Box part = intersect(want, s.box);
    if (part.empty()) continue;
    covered += part.volume();
    SafetensorsReader& r = impl_->reader(s.file);
    const SafetensorsEntry& e = r.at(name);
    for_each_run(part, s.box, count, want, [&](int64_t a, int64_t b, int64_t n) {
      char* out = static_cast<char*>(dst) + size_t(b) * es;
      while (n > 0) {
        const int64_t k = std::min<int64_t>(n, int64_t(impl_->buf.size() / fs_));
        r.read_range(e, a * int64_t(fs_), k * int64_t(fs_), impl_->buf.data());
        convert_from_file(t->dtype, impl_->buf.data(), to, out, k, name);
        a += k, n -= k, out += size_t(k) * es;
      }
    });
  }
  MT_CHECK_T(IoError, covered == want.volume(),
             "checkpoint {}: the slices of {} cover {} of the {} elements of {}", impl_->dir, name,
             covered, want.volume(), want.to_string());
}

namespace {

void start_output(const std::string& out, const std::string& tmp) {
  MT_CHECK_T(IoError, !fs::exists(out), "convert: {} already exists (nothing is replaced)", out);
  if (fs::exists(tmp)) fs::remove_all(tmp);  // left by a conversion that died
  fs::create_directories(tmp);
}

void finish_output(const std::string& out, const std::string& tmp) {
  sync_directory(tmp);
  rename_no_replace(tmp, out);
  const fs::path parent = fs::path(out).parent_path();
  sync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace

void convert_checkpoint_to_hf(const std::string& dir, const CheckpointIndex& ix, const Model& model,
                              const ParallelPlan& plan, int64_t seq_len, DType compute,
                              const std::string& out, const ConvertOptions& o) {
  check_checkpoint_matches(ix, dir, plan, false);
  HfLayout layout(model, plan.params());
  HfShardPlan shards = plan_hf_shards(layout, o.dtype, o.max_shard_bytes);
  const std::string tmp = out + ".tmp";
  start_output(out, tmp);
  create_hf_files(shards, tmp);
  bool f64 = false;
  for (const StoredTensor& t : ix.tensors) f64 |= t.dtype == FileDType::kF64;
  const DType read_as = f64 ? DType::kF64 : DType::kF32;
  CheckpointSource src(dir, ix);
  {
    HfFileWriter w(shards, layout, tmp);
    write_hf_from_source(w, layout, src, read_as, o.chunk_bytes, o.progress);
    w.sync();
  }
  bool bias_zero = true;
  for (const HfTensor& t : layout.tensors()) {
    if (t.param.find(".expert_bias") == std::string::npos) continue;
    std::vector<double> b(size_t(t.shape[0]));
    src.read_box(t.param, {0}, {t.shape[0]}, DType::kF64, b.data());
    for (double v : b) bias_zero &= v == 0.0;
  }
  write_hf_index(shards, layout,
                 hf_config_json(model, seq_len, compute, torch_dtype_name(o.dtype), bias_zero),
                 tmp);
  finish_output(out, tmp);
}

void convert_hf_to_checkpoint(const std::string& hf_dir, const Model& model,
                              const ParallelPlan& plan, int64_t seq_len, DType compute,
                              const std::string& config_toml, const std::string& out,
                              const ConvertOptions& o) {
  HfFolder hf(hf_dir);
  for (const std::string& n : require_hf_config_match(hf.config(), model, seq_len, compute))
    log_info("convert: {}", n);
  HfLayout layout(model, plan.params());
  const DType row_dtype = o.dtype == FileDType::kF64 ? DType::kF64 : DType::kF32;
  hf.check(layout, row_dtype);
  const std::vector<CheckpointTensor> tensors = checkpoint_tensors(plan, true);
  const std::string tmp = out + ".tmp";
  start_output(out, tmp);
  const int64_t fes = int64_t(file_dtype_size(o.dtype));
  // Tensors in order, a new file (a virtual rank's part) when the next would pass the limit.
  std::vector<std::vector<size_t>> files(1);
  int64_t in_file = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = tensors[i].param->global_shape.numel() * fes;
    if (!files.back().empty() && in_file + b > o.max_shard_bytes) files.emplace_back(), in_file = 0;
    files.back().push_back(i);
    in_file += b, total += b;
  }
  HfProgress pr{.tensors = int64_t(tensors.size()), .bytes = total};
  std::vector<char> rows, conv;
  for (size_t f = 0; f < files.size(); ++f) {
    SafetensorsWriter w((fs::path(tmp) / rank_file_name(int(f))).string());
    for (size_t i : files[f])
      w.add(tensors[i].name, o.dtype, tensors[i].param->global_shape.dims());
    for (size_t i : files[f]) {
      const ParamInfo& p = *tensors[i].param;
      const Shape& g = p.global_shape;
      const int64_t cols = g.last(), total_rows = g.rows();
      const int64_t step = std::max<int64_t>(1, o.chunk_bytes / std::max<int64_t>(1, cols * 8));
      const size_t es = dtype_size(row_dtype);
      const std::vector<const HfTensor*> copies = layout.copies_of(p.name);
      for (int64_t r0 = 0; r0 < total_rows; r0 += step) {
        const int64_t n = std::min(step, total_rows - r0);
        rows.assign(size_t(n * cols) * es, 0);
        if (layout.covers(p.name)) {
          for (int64_t r = r0; r < r0 + n; ++r) {
            const int64_t lead = g.rank() == 3 ? r / g[1] : 0;
            const int64_t row = g.rank() == 3 ? r % g[1] : g.rank() == 2 ? r : 0;
            const HfRow at = layout.locate(p.name, lead, row);
            char* dst = rows.data() + size_t((r - r0) * cols) * es;
            if (const HfFolder::Entry* e = hf.find(at.tensor->hf_name)) {
              hf.read_row(at.tensor->hf_name, *e, at.row, 0, cols, row_dtype, dst);
              check_shared_copies(hf, copies, at.tensor->hf_name, at.row, 0, cols, row_dtype, dst);
            }
          }
        }  // else a token counter: zeros
        conv.resize(size_t(n * cols * fes));
        convert_to_file(row_dtype, rows.data(), o.dtype, conv.data(), n * cols, p.name);
        w.write(conv.data(), conv.size());
        pr.bytes_done += n * cols * fes;
        pr.current = &tensors[i].name;
        if (o.progress) o.progress(pr);
      }
      ++pr.tensors_done;
      if (o.progress) o.progress(pr);
    }
    const SafetensorsWritten done = w.finish();
    RankManifest m;
    m.rank = int(f);
    m.file = StoredFile{rank_file_name(int(f)), int(f), done.bytes, done.crc32};
    for (size_t k = 0; k < files[f].size(); ++k) {
      const SafetensorsEntry& e = w.entries()[k];
      Box whole{std::vector<int64_t>(e.shape.size(), 0), e.shape};
      m.tensors.push_back(StoredTensor{
          e.name, e.dtype, e.shape, {StoredSlice{m.file.name, whole, e.begin, e.end}}});
    }
    write_file_durably((fs::path(tmp) / manifest_name(int(f))).string(), m.to_json());
  }
  CheckpointIndex head;
  head.step = 0;
  head.model_only = true;
  head.config_toml = config_toml;
  head.state.dp_degree = 1;
  head.state.seq_len = seq_len;
  head.state.master_dtype = dtype_name(row_dtype);
  finalize_checkpoint(tmp, out, int(files.size()), head, checkpoint_tensor_names(plan, true),
                      nullptr);
}

}  // namespace meshtrain
