// Optimizer graph construction and step, and its overlap with the next step (optimizer.h).
#include "meshtrain/optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "meshtrain/moe/load_balance.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {

std::string param_layer(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return name;
  const size_t next = name.find('.', dot + 1);
  const std::string second =
      name.substr(dot + 1, next == std::string::npos ? next : next - dot - 1);
  const bool numbered = !second.empty() && std::all_of(second.begin(), second.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
  return numbered ? name.substr(0, next) : name.substr(0, dot);
}

namespace {

// Slice starts are rounded down to this many elements, so every slice's pointers keep the
// alignment of the flat buffers (the CUDA element-wise loop's 16-byte vectors).
constexpr int64_t kSliceAlign = 64;
// A layer's slice ends at the next parameter once it holds this many elements (a MoE layer's
// expert weights, ~185 M elements each at 16B, become slices of their own), so that the next
// step's first nodes of a layer wait for its first parameters only.
constexpr int64_t kSliceSplitElements = int64_t(32) << 20;

// Group g's AdamW slices: one per run of consecutive parameters (by offset) of one layer, split
// where it passes kSliceSplitElements, the whole group covered; or the whole group as one slice.
std::vector<OptimizerGraph::Slice> group_slices(size_t gi, const ParamGroup& g,
                                                const ParallelPlan& plan, bool by_layer) {
  const int64_t numel = std::max<int64_t>(g.numel, 1);
  if (!by_layer || g.params.empty()) return {{gi, 0, numel, "all", -1}};
  std::vector<size_t> order(g.params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return g.offsets[a] < g.offsets[b]; });
  std::vector<OptimizerGraph::Slice> out;
  std::string layer_of_last;
  int parts = 0;  // slices of the current layer so far
  for (size_t i : order) {
    const std::string layer = param_layer(plan.params()[g.params[i]].name);
    const int64_t start = out.empty() ? 0 : g.offsets[i] / kSliceAlign * kSliceAlign;
    if (!out.empty() && start <= out.back().begin) continue;
    const bool same = !out.empty() && layer == layer_of_last;
    if (same && start - out.back().begin < kSliceSplitElements) continue;
    parts = same ? parts + 1 : 1;
    layer_of_last = layer;
    out.push_back({gi, start, 0, parts == 1 ? layer : layer + ".part" + std::to_string(parts), -1});
  }
  for (size_t s = 0; s < out.size(); ++s)
    out[s].count = (s + 1 < out.size() ? out[s + 1].begin : numel) - out[s].begin;
  return out;
}

}  // namespace

void build_optimizer_graph(OptimizerGraph& og, const std::vector<ParamGroup>& groups,
                           const ParallelPlan& plan, const ops::AdamWParams& params,
                           const LoadBalanceOptions& lb, bool by_layer) {
  Graph& graph = og.graph;
  Builder b(graph, NodePhase::kOptimizer);
  og.lr_slot = graph.add_scalar("lr");
  og.step_slot = graph.add_scalar("step");
  const DType dtype = plan.config().master_dtype;
  auto tag = [](const ParamGroup& g) {
    return g.norm_groups.empty() ? std::string("local") : mesh_group_list(g.norm_groups);
  };
  for (const ParamGroup& g : groups) {
    // The flat buffers ParamStore allocates: at least one element.
    TensorMeta meta{Shape{std::max<int64_t>(g.numel, 1)}, dtype};
    const std::string t = tag(g);
    og.groups.push_back({b.persistent("group." + t + ".master", meta, ValueRole::kParameter),
                         b.persistent("group." + t + ".grad", meta, ValueRole::kGradient),
                         b.persistent("group." + t + ".exp_avg", meta, ValueRole::kState),
                         b.persistent("group." + t + ".exp_avg_sq", meta, ValueRole::kState)});
    if (g.has_compute)
      og.groups.back().compute = b.persistent(
          "group." + t + ".compute", {meta.shape, g.compute_dtype}, ValueRole::kComputeCopy);
  }
  ValueId total = kNoValue;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    auto s = b.scope("grad_norm." + tag(g));
    ValueId sq = ops::sum_squares(b, og.groups[i].grad);
    // Shards are disjoint over each listed group: summing over them counts every element once.
    for (MeshGroup group : g.norm_groups) sq = ops::all_reduce(b, sq, group);
    total = total == kNoValue ? sq : ops::add(b, total, sq);
  }
  if (total == kNoValue) total = ops::fill(b, Shape{1}, DType::kF64, 0.0);
  og.norm_sq = total;
  graph.mark_output(og.norm_sq);
  // Load balancing runs where torchtitan's optimizer pre-hook does, before the update (the two
  // are independent). The counts summed over `count_group` make the update the global one.
  for (const LoadBalanceLayer& l : lb.layers) {
    auto s = b.scope(l.layer + ".load_balance", l.block);
    auto state = [&](const std::string& name) {
      const ParamInfo& p = plan.info(name);
      ValueId v = b.persistent(name, {p.local_shape, p.dtype}, ValueRole::kState);
      og.state.emplace_back(v, name);
      return v;
    };
    ValueId bias = state(l.expert_bias), counter = state(l.tokens_per_expert),
            load = state(l.last_load);
    ValueId counts = lb.count_group ? ops::all_reduce(b, counter, *lb.count_group) : kNoValue;
    const NodeId first = graph.num_nodes();
    ops::expert_bias_update(b, bias, counter, load, l.coeff, counts);
    for (NodeId n = first; n < graph.num_nodes(); ++n) og.state_nodes.push_back(n);
  }
  for (size_t gi = 0; gi < og.groups.size(); ++gi) {
    const OptimizerGraph::GroupValues& v = og.groups[gi];
    for (OptimizerGraph::Slice slice : group_slices(gi, groups[gi], plan, by_layer)) {
      auto s = b.scope(slice.name == "all" ? std::string("adamw") : "adamw." + slice.name);
      const ops::ElementRange range =
          slice.name == "all" ? ops::ElementRange{} : ops::ElementRange{slice.begin, slice.count};
      ops::adamw_update(b, v.master, v.grad, v.exp_avg, v.exp_avg_sq, total, og.lr_slot,
                        og.step_slot, params, v.compute, range);
      slice.node = graph.num_nodes() - 1;
      og.slices.push_back(std::move(slice));
    }
  }
}

Optimizer::Optimizer(ParamStore& store, const ops::AdamWParams& params, Backend& backend,
                     ExecServices* services, const LoadBalanceOptions& lb, bool overlap_next_step)
    : store_(store),
      backend_(backend),
      overlap_(overlap_next_step),
      stream_(overlap_next_step ? kOptimizerStream : 0) {
  build_optimizer_graph(og_, store.groups(), store.plan(), params, lb, overlap_);
  exec_ = std::make_unique<Executor>(og_.graph, plan_memory(og_.graph, backend.device().type),
                                     backend, services);
  exec_->set_main_stream(stream_);
  host_norm_ = Tensor::empty(Shape{1}, DType::kF64, backend.host_staging_allocator());
  grads_ready_ = backend.create_event(false);
  norm_ready_ = backend.create_event(false);
  done_ = backend.create_event(false);
  // The norm goes to the host as soon as it is known, not after the update.
  exec_->after_node(og_.graph.value(og_.norm_sq).producer, [this](Stream& s) {
    backend_.copy(host_norm_.raw(), exec_->tensor(og_.norm_sq).raw(), 8, CopyKind::kDeviceToHost,
                  s);
    norm_ready_->record(s);
  });
  // The node among those `pick` takes that the schedule runs last (-1: none).
  auto last_scheduled = [&](auto pick) {
    NodeId last = -1;
    for (NodeId n : exec_->plan().schedule)
      if (pick(n)) last = n;
    return last;
  };
  // The update's collectives (the norm's and the load counts' all-reduces, early in its
  // schedule) must be over before the next step enqueues its own on the same communicators, or
  // ranks could interleave the two differently: step() waits for the last of them.
  const NodeId last_collective = last_scheduled(
      [&](NodeId n) { return OpRegistry::instance().op(og_.graph.node(n).op).is_collective(); });
  if (overlap_ && last_collective >= 0) {
    collectives_done_ = backend.create_event(false);
    exec_->after_node(last_collective, [this](Stream& s) { collectives_done_->record(s); });
  }
  const NodeId last_state = last_scheduled([&](NodeId n) {
    return std::find(og_.state_nodes.begin(), og_.state_nodes.end(), n) != og_.state_nodes.end();
  });
  if (last_state >= 0) {
    state_ready_ = backend.create_event(false);
    exec_->after_node(last_state, [this](Stream& s) { state_ready_->record(s); });
  }
  for (const OptimizerGraph::Slice& slice : og_.slices) {
    slice_done_.push_back(backend.create_event(false));
    Event* e = slice_done_.back().get();
    exec_->after_node(slice.node, [e](Stream& s) { e->record(s); });
  }
  for (size_t i = 0; i < og_.groups.size(); ++i) {
    const ParamGroup& g = store.groups()[i];
    exec_->bind(og_.groups[i].master, g.master);
    exec_->bind(og_.groups[i].grad, g.grad);
    exec_->bind(og_.groups[i].exp_avg, g.exp_avg);
    exec_->bind(og_.groups[i].exp_avg_sq, g.exp_avg_sq);
    if (og_.groups[i].compute != kNoValue) exec_->bind(og_.groups[i].compute, g.compute);
  }
  for (const auto& [v, name] : og_.state) exec_->bind(v, store.master(name));
  exec_->prepare();
}

Optimizer::~Optimizer() = default;

void Optimizer::step(int64_t step, double lr) {
  Stream& update = backend_.stream(stream_);
  if (overlap_) {  // after the step's backward, which stream 0 ends with
    grads_ready_->record(backend_.stream(0));
    grads_ready_->wait(update);
  }
  exec_->set_scalar(og_.lr_slot, lr);
  exec_->set_scalar(og_.step_slot, double(step));
  exec_->run();
  done_->record(update);
  // Host sync (overlap with collectives in the update): see the constructor.
  if (collectives_done_) collectives_done_->synchronize();
}

double Optimizer::last_grad_norm() {
  // Host sync: the trainer reads the norm every step for its non-finite check and the log line;
  // it waits for the norm's nodes only, not for the update after them.
  norm_ready_->synchronize();
  return std::sqrt(host_norm_.data<double>()[0]);
}

void Optimizer::join(Stream& s) { done_->wait(s); }

void Optimizer::join_state(Stream& s) {
  if (state_ready_) state_ready_->wait(s);
}

std::vector<ExternalWrite> Optimizer::writes() const {
  std::vector<ExternalWrite> out;
  if (!overlap_) return out;
  auto range = [&](Event* e, const Tensor& t, int64_t begin, int64_t count) {
    if (!t.defined()) return;
    const size_t elem = dtype_size(t.dtype());
    const uintptr_t base = reinterpret_cast<uintptr_t>(t.raw());
    out.push_back({e, base + size_t(begin) * elem, base + size_t(begin + count) * elem});
  };
  for (size_t i = 0; i < og_.slices.size(); ++i) {
    const OptimizerGraph::Slice& s = og_.slices[i];
    const ParamGroup& g = store_.groups()[s.group];
    for (const Tensor* t : {&g.master, &g.grad, &g.exp_avg, &g.exp_avg_sq, &g.compute})
      range(slice_done_[i].get(), *t, s.begin, s.count);
  }
  for (const auto& [v, name] : og_.state) {
    const Tensor& t = exec_->tensor(v);
    range(state_ready_.get(), t, 0, t.numel());
  }
  return out;
}

}  // namespace meshtrain
