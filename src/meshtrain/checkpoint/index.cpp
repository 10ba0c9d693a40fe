// Index and manifest JSON: writing, and parsing that names what is missing or inconsistent.
#include "meshtrain/checkpoint/index.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "meshtrain/checkpoint/file_io.h"

namespace meshtrain {

using json = nlohmann::ordered_json;

namespace {

// Typed access that throws IoError "<where> is corrupted: <path>: ..." instead of json's own.
struct Field {
  const json& j;
  std::string path;
  const std::string& where;

  [[noreturn]] void fail(const std::string& why) const {
    MT_THROW(IoError, "{} is corrupted: {}: {}", where, path.empty() ? "top level" : path, why);
  }
  Field at(const char* key) const {
    if (!j.is_object()) fail("expected an object");
    auto it = j.find(key);
    if (it == j.end()) fail(fmt::format("missing \"{}\"", key));
    return Field{*it, path.empty() ? key : path + "." + key, where};
  }
  Field at(size_t i) const { return Field{j[i], fmt::format("{}[{}]", path, i), where}; }
  size_t size() const {
    if (!j.is_array()) fail("expected an array");
    return j.size();
  }
  int64_t i64() const {
    if (!j.is_number_integer()) fail(fmt::format("expected an integer, found {}", j.dump()));
    return j.get<int64_t>();
  }
  double f64() const {
    if (!j.is_number()) fail(fmt::format("expected a number, found {}", j.dump()));
    return j.get<double>();
  }
  bool boolean() const {
    if (!j.is_boolean()) fail(fmt::format("expected true or false, found {}", j.dump()));
    return j.get<bool>();
  }
  std::string str() const {
    if (!j.is_string()) fail(fmt::format("expected a string, found {}", j.dump()));
    return j.get<std::string>();
  }
  std::vector<int64_t> i64s() const {
    std::vector<int64_t> v;
    for (size_t i = 0; i < size(); ++i) v.push_back(at(i).i64());
    return v;
  }
  uint32_t crc() const {
    const std::string s = str();
    if (s.size() != 10 || s.rfind("0x", 0) != 0 ||
        s.find_first_not_of("0123456789abcdef", 2) != std::string::npos)
      fail(fmt::format("expected a CRC-32 like \"0x1a2b3c4d\", found \"{}\"", s));
    return uint32_t(std::stoul(s.substr(2), nullptr, 16));
  }
};

json slice_json(const StoredSlice& s) {
  return json{{"file", s.file},
              {"offsets", s.box.lo},
              {"extents", s.box.ext},
              {"byte_range", {s.begin, s.end}}};
}

json tensor_json(const StoredTensor& t) {
  json slices = json::array();
  for (const StoredSlice& s : t.slices) slices.push_back(slice_json(s));
  return json{{"name", t.name},
              {"dtype", file_dtype_name(t.dtype)},
              {"shape", t.shape},
              {"slices", std::move(slices)}};
}

json file_json(const StoredFile& f) {
  return json{
      {"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"crc32", crc32_hex(f.crc32)}};
}

json loader_json(const LoaderPosition& l) {
  return json{{"dp_rank", l.dp_rank},
              {"step", l.step},
              {"micro_batch", l.micro_batch},
              {"epoch", l.epoch},
              {"window_offset", l.window_offset},
              {"next_window", l.next_window}};
}

StoredTensor parse_tensor(const Field& f) {
  StoredTensor t;
  t.name = f.at("name").str();
  const std::string dt = f.at("dtype").str();
  const auto d = parse_file_dtype(dt);
  if (!d) f.at("dtype").fail(fmt::format("unknown dtype \"{}\"", dt));
  t.dtype = *d;
  t.shape = f.at("shape").i64s();
  const Field slices = f.at("slices");
  for (size_t i = 0; i < slices.size(); ++i) {
    const Field s = slices.at(i);
    StoredSlice sl;
    sl.file = s.at("file").str();
    sl.box.lo = s.at("offsets").i64s();
    sl.box.ext = s.at("extents").i64s();
    const std::vector<int64_t> r = s.at("byte_range").i64s();
    if (r.size() != 2) s.at("byte_range").fail("expected [begin, end]");
    sl.begin = r[0], sl.end = r[1];
    if (sl.box.lo.size() != t.shape.size() || sl.box.ext.size() != t.shape.size())
      s.fail(fmt::format("offsets/extents of rank {}/{} for a tensor of rank {}", sl.box.lo.size(),
                         sl.box.ext.size(), t.shape.size()));
    for (size_t k = 0; k < t.shape.size(); ++k)
      if (sl.box.lo[k] < 0 || sl.box.ext[k] < 0 || sl.box.lo[k] + sl.box.ext[k] > t.shape[k])
        s.fail(fmt::format("slice {} lies outside the tensor's shape [{}]", sl.box.to_string(),
                           fmt::join(t.shape, ", ")));
    if (sl.begin < 0 || sl.end - sl.begin != sl.box.volume() * int64_t(file_dtype_size(t.dtype)))
      s.fail(fmt::format("byte_range [{}, {}] does not hold the {} {} elements of slice {}",
                         sl.begin, sl.end, sl.box.volume(), dt, sl.box.to_string()));
    t.slices.push_back(std::move(sl));
  }
  return t;
}

StoredFile parse_file(const Field& f) {
  return StoredFile{f.at("name").str(), int(f.at("rank").i64()), f.at("bytes").i64(),
                    f.at("crc32").crc()};
}

LoaderPosition parse_loader(const Field& f) {
  return LoaderPosition{f.at("dp_rank").i64(),       f.at("step").i64(),
                        f.at("micro_batch").i64(),   f.at("epoch").i64(),
                        f.at("window_offset").i64(), f.at("next_window").i64()};
}

// JSON for people and for grep: one key per line at the top level, one array element per line
// (a tensor with its slices, a file), nested objects indented.
std::string dump_readable(const json& top) {
  std::string out = "{\n";
  size_t i = 0;
  for (auto it = top.begin(); it != top.end(); ++it, ++i) {
    out += fmt::format(" {}: ", json(it.key()).dump());
    if (it.value().is_array()) {
      out += "[";
      for (size_t k = 0; k < it.value().size(); ++k)
        out += (k ? ",\n  " : "\n  ") + it.value()[k].dump();
      out += it.value().empty() ? "]" : "\n ]";
    } else {
      std::string v = it.value().dump(1);
      for (size_t at = v.find('\n'); at != std::string::npos; at = v.find('\n', at + 2))
        v.replace(at, 1, "\n ");
      out += v;
    }
    out += i + 1 < top.size() ? ",\n" : "\n";
  }
  return out + "}\n";
}

json parse_text(std::string_view text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    MT_THROW(IoError, "{} is corrupted: not valid JSON ({})", where, e.what());
  }
}

}  // namespace

std::string MeshDegrees::describe() const {
  std::string s = fmt::format("{} rank{}", world, world == 1 ? "" : "s");
  std::string dims;
  auto add = [&](const char* n, int v) {
    if (v > 1) dims += fmt::format("{}{} {}", dims.empty() ? "" : ", ", n, v);
  };
  add("dp_replicate", dp_replicate), add("dp_shard", dp_shard), add("cp", cp), add("tp", tp);
  add("ep", ep), add("etp", etp);
  return dims.empty() ? s : s + ": " + dims;
}

const StoredTensor* CheckpointIndex::find(std::string_view name) const {
  for (const StoredTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const StoredFile* CheckpointIndex::file(std::string_view name) const {
  for (const StoredFile& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

int64_t CheckpointIndex::total_bytes() const {
  int64_t b = 0;
  for (const StoredFile& f : files) b += f.bytes;
  return b;
}

std::string CheckpointIndex::to_json() const {
  const TrainState& s = state;
  json loader = json::array();
  for (const LoaderPosition& l : s.loader) loader.push_back(loader_json(l));
  const MeshDegrees& m = s.layout;
  json st = {{"step", s.step},
             {"optimizer_step", s.optimizer_step},
             {"lr_step", s.lr_step},
             {"lr", s.lr},
             {"seed", s.seed},
             {"master_dtype", s.master_dtype},
             {"layout",
              {{"world", m.world},
               {"dp_replicate", m.dp_replicate},
               {"dp_shard", m.dp_shard},
               {"cp", m.cp},
               {"tp", m.tp},
               {"ep", m.ep},
               {"etp", m.etp}}},
             {"dataloader",
              {{"dataset", s.dataset},
               {"seq_len", s.seq_len},
               {"local_batch", s.local_batch},
               {"dp_degree", s.dp_degree},
               {"accum_steps", s.accum_steps},
               {"windows_per_epoch", s.windows_per_epoch},
               {"next_window", s.next_window},
               {"ranks", std::move(loader)}}}};
  json fs = json::array(), ts = json::array();
  for (const StoredFile& f : files) fs.push_back(file_json(f));
  for (const StoredTensor& t : tensors) ts.push_back(tensor_json(t));
  json j = {{"format", "meshtrain checkpoint"}, {"version", version},     {"step", step},
            {"model_only", model_only},         {"state", std::move(st)}, {"files", std::move(fs)},
            {"tensors", std::move(ts)},         {"config", config_toml}};
  return dump_readable(j);
}

CheckpointIndex CheckpointIndex::parse(std::string_view text, const std::string& where) {
  const json j = parse_text(text, where);
  const Field top{j, "", where};
  CheckpointIndex ix;
  if (top.at("format").str() != "meshtrain checkpoint")
    top.at("format").fail("expected \"meshtrain checkpoint\"");
  ix.version = int(top.at("version").i64());
  if (ix.version != kIndexVersion)
    top.at("version").fail(
        fmt::format("version {} (this meshtrain reads {})", ix.version, kIndexVersion));
  ix.step = top.at("step").i64();
  ix.model_only = top.at("model_only").boolean();
  ix.config_toml = top.at("config").str();
  const Field st = top.at("state");
  TrainState& s = ix.state;
  s.step = st.at("step").i64();
  s.optimizer_step = st.at("optimizer_step").i64();
  s.lr_step = st.at("lr_step").i64();
  s.lr = st.at("lr").f64();
  s.seed = uint64_t(st.at("seed").i64());
  s.master_dtype = st.at("master_dtype").str();
  const Field m = st.at("layout");
  s.layout = MeshDegrees{int(m.at("world").i64()),    int(m.at("dp_replicate").i64()),
                         int(m.at("dp_shard").i64()), int(m.at("cp").i64()),
                         int(m.at("tp").i64()),       int(m.at("ep").i64()),
                         int(m.at("etp").i64())};
  const Field dl = st.at("dataloader");
  s.dataset = dl.at("dataset").str();
  s.seq_len = dl.at("seq_len").i64();
  s.local_batch = dl.at("local_batch").i64();
  s.dp_degree = dl.at("dp_degree").i64();
  s.accum_steps = dl.at("accum_steps").i64();
  s.windows_per_epoch = dl.at("windows_per_epoch").i64();
  s.next_window = dl.at("next_window").i64();
  const Field ranks = dl.at("ranks");
  for (size_t i = 0; i < ranks.size(); ++i) s.loader.push_back(parse_loader(ranks.at(i)));
  const Field fs = top.at("files");
  for (size_t i = 0; i < fs.size(); ++i) ix.files.push_back(parse_file(fs.at(i)));
  const Field ts = top.at("tensors");
  for (size_t i = 0; i < ts.size(); ++i) {
    StoredTensor t = parse_tensor(ts.at(i));
    for (size_t k = 0; k < t.slices.size(); ++k) {
      const StoredFile* f = ix.file(t.slices[k].file);
      if (!f)
        ts.at(i).fail(fmt::format("tensor {} has a slice in {}, which the index does not list",
                                  t.name, t.slices[k].file));
      if (t.slices[k].end > f->bytes)
        ts.at(i).fail(fmt::format("tensor {}: byte_range ends at {}, past the {} bytes of {}",
                                  t.name, t.slices[k].end, f->bytes, f->name));
    }
    if (ix.find(t.name)) ts.at(i).fail(fmt::format("tensor {} is listed twice", t.name));
    check_tiling(t, where);
    ix.tensors.push_back(std::move(t));
  }
  return ix;
}

std::string RankManifest::to_json() const {
  json ts = json::array();
  for (const StoredTensor& t : tensors) ts.push_back(tensor_json(t));
  json j = {{"rank", rank},
            {"file", file_json(file)},
            {"loader", loader_json(loader)},
            {"write_seconds", write_seconds},
            {"tensors", std::move(ts)}};
  return dump_readable(j);
}

RankManifest RankManifest::parse(std::string_view text, const std::string& where) {
  const json j = parse_text(text, where);
  const Field top{j, "", where};
  RankManifest m;
  m.rank = int(top.at("rank").i64());
  m.file = parse_file(top.at("file"));
  m.loader = parse_loader(top.at("loader"));
  m.write_seconds = top.at("write_seconds").f64();
  const Field ts = top.at("tensors");
  for (size_t i = 0; i < ts.size(); ++i) m.tensors.push_back(parse_tensor(ts.at(i)));
  return m;
}

std::string manifest_name(int rank) { return fmt::format("rank-{:05d}.json", rank); }
std::string rank_file_name(int rank) { return fmt::format("rank-{:05d}.safetensors", rank); }

void check_tiling(const StoredTensor& t, const std::string& where) {
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  int64_t covered = 0;
  std::vector<const StoredSlice*> s;
  for (const StoredSlice& sl : t.slices) {
    covered += sl.box.volume();
    if (!sl.box.empty()) s.push_back(&sl);
  }
  // Sweep along dim 0: only slices whose dim-0 ranges meet can overlap.
  std::sort(s.begin(), s.end(), [](auto* a, auto* b) {
    return a->box.lo.empty() ? false : a->box.lo[0] < b->box.lo[0];
  });
  for (size_t i = 0; i < s.size(); ++i)
    for (size_t k = i + 1; k < s.size(); ++k) {
      if (!s[i]->box.lo.empty() && s[k]->box.lo[0] >= s[i]->box.lo[0] + s[i]->box.ext[0]) break;
      MT_CHECK_T(IoError, intersect(s[i]->box, s[k]->box).empty(),
                 "{}: tensor {} has overlapping slices {} ({}) and {} ({})", where, t.name,
                 s[i]->box.to_string(), s[i]->file, s[k]->box.to_string(), s[k]->file);
    }
  MT_CHECK_T(IoError, covered == numel,
             "{}: the slices of tensor {} hold {} of its {} elements (shape [{}])", where, t.name,
             covered, numel, fmt::join(t.shape, ", "));
}

}  // namespace meshtrain
