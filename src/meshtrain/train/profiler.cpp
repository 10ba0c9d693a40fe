// Profiler (see header): event recording around nodes and the Chrome trace writer.
#include "meshtrain/train/profiler.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/ir/op_registry.h"
#include "meshtrain/train/cost_model.h"

namespace meshtrain {
namespace {

std::string meta_string(const Graph& g, const std::vector<ValueId>& vs) {
  std::string out;
  for (size_t i = 0; i < vs.size(); ++i) {
    const TensorMeta& m = g.value(vs[i]).meta;
    if (i) out += ", ";
    out += fmt::format("{}{}", dtype_name(m.dtype), m.shape);
  }
  return out;
}

}  // namespace

Profiler::Profiler(Backend& backend, const Executor& exec, int runs_per_step, int rank)
    : backend_(backend), exec_(exec), rank_(rank), runs_per_step_(std::max(1, runs_per_step)) {
  const Graph& g = exec_.graph();
  const std::vector<NodeId>& schedule = exec_.plan().schedule;
  schedule_size_ = int64_t(schedule.size());
  records_.resize(size_t(schedule_size_ * runs_per_step_));
  for (Record& r : records_) {
    r.start = backend_.create_event(true);
    r.end = backend_.create_event(true);
  }
  // Track names: stream 0 computes; a communication stream is named by the group of the
  // collectives the stream-assignment pass put there.
  int max_stream = 0;
  for (NodeId id : schedule) max_stream = std::max(max_stream, g.node(id).stream);
  stream_names_.assign(size_t(max_stream + 1), "");
  stream_names_[0] = "compute";
  for (NodeId id : schedule) {
    const Node& n = g.node(id);
    if (n.stream == 0 || !stream_names_[size_t(n.stream)].empty()) continue;
    if (n.attrs.has("group")) stream_names_[size_t(n.stream)] = mesh_group_name(n.attrs.group());
  }
  for (size_t s = 1; s < stream_names_.size(); ++s)
    if (stream_names_[s].empty()) stream_names_[s] = fmt::format("stream {}", s);
}

Profiler::~Profiler() = default;

std::string Profiler::stream_name(int stream) const {
  if (stream >= 0 && stream < int(stream_names_.size())) return stream_names_[size_t(stream)];
  return fmt::format("stream {}", stream);
}

void Profiler::begin_step() { next_ = 0; }

void Profiler::before(const Node& node, Stream& stream) {
  MT_CHECK(next_ < int(records_.size()),
           "profiler: more node runs in this step than the {} schedule entries x {} runs it was "
           "made for",
           schedule_size_, runs_per_step_);
  Record& r = records_[size_t(next_)];
  r.node = &node;
  r.stream = node.stream;
  r.run = int(int64_t(next_) / std::max<int64_t>(schedule_size_, 1));
  r.start->record(stream);
}

void Profiler::after(const Node&, Stream& stream) {
  records_[size_t(next_)].end->record(stream);
  ++next_;
}

std::string Profiler::write_trace(const std::string& folder, int64_t step) {
  // Host sync: the events of the step must have completed before their times are read; only
  // profiled steps get here.
  backend_.synchronize();
  const Graph& g = exec_.graph();
  std::vector<double> start_ms(static_cast<size_t>(next_)), dur_ms(static_cast<size_t>(next_));
  double origin = 0;
  for (int i = 0; i < next_; ++i) {
    const Record& r = records_[size_t(i)];
    start_ms[size_t(i)] = r.start->elapsed_ms(*records_[0].start);
    dur_ms[size_t(i)] = std::max(0.0f, r.end->elapsed_ms(*r.start));
    origin = std::min(origin, start_ms[size_t(i)]);
  }

  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", fmt::format("rank {}", rank_)}}}});
  std::vector<char> used(stream_names_.size(), 0);
  for (int i = 0; i < next_; ++i) used[size_t(records_[size_t(i)].stream)] = 1;
  used[0] = 1;
  for (size_t s = 0; s < used.size(); ++s) {
    if (!used[s]) continue;
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank_},
                      {"tid", int(s)},
                      {"args", {{"name", stream_names_[s]}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", rank_},
                      {"tid", int(s)},
                      {"args", {{"sort_index", int(s)}}}});
  }
  for (int i = 0; i < next_; ++i) {
    const Record& r = records_[size_t(i)];
    const Node& n = *r.node;
    events.push_back(
        {{"name", n.op},
         {"cat", node_phase_name(n.phase)},
         {"ph", "X"},
         {"pid", rank_},
         {"tid", r.stream},
         {"ts", (start_ms[size_t(i)] - origin) * 1e3},
         {"dur", dur_ms[size_t(i)] * 1e3},
         {"args",
          {{"scope", n.scope},
           {"phase", node_phase_name(n.phase)},
           {"shapes", fmt::format("{} -> {}", meta_string(g, n.inputs), meta_string(g, n.outputs))},
           {"node", n.id},
           {"micro_batch", r.run},
           {"flops", node_work(g, n).flops},
           {"bytes", node_work(g, n).bytes}}}});
  }
  nlohmann::json trace = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"step", step}, {"rank", rank_}, {"device", backend_.description()}}}};

  std::filesystem::path dir = std::filesystem::path(folder) / fmt::format("iteration_{}", step);
  std::filesystem::create_directories(dir);
  std::filesystem::path file = dir / fmt::format("rank{}_trace.json", rank_);
  std::ofstream out(file);
  MT_CHECK_T(IoError, bool(out), "cannot write profiler trace {}", file.string());
  out << trace.dump(1) << "\n";
  MT_CHECK_T(IoError, bool(out), "writing profiler trace {} failed", file.string());
  return file.string();
}

}  // namespace meshtrain
