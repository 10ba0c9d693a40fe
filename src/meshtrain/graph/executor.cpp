// Executor: memory binding, kernel resolution and the step loop.
#include "meshtrain/graph/executor.h"

#include <algorithm>
#include <map>
#include <set>

namespace meshtrain {

Executor::Executor(const Graph& graph, MemoryPlan plan, Backend& backend, ExecServices* services)
    : graph_(graph), plan_(std::move(plan)), backend_(backend), services_(services) {
  tensors_.resize(size_t(graph_.num_values()));
  scalars_.assign(graph_.scalar_names().size(), 0.0);
}

Executor::~Executor() = default;

void Executor::bind(ValueId v, Tensor t) {
  const Value& val = graph_.value(v);
  MT_CHECK(is_persistent(val.role), "bind() is for persistent values; %{} ({}) is {}", v, val.name,
           value_role_name(val.role));
  MT_CHECK(t.shape() == val.meta.shape && t.dtype() == val.meta.dtype,
           "binding {}: expected {} {}, found {} {}", val.name, dtype_name(val.meta.dtype),
           val.meta.shape, dtype_name(t.dtype()), t.shape());
  tensors_[size_t(v)] = std::move(t);
}

void Executor::set_main_stream(int index) {
  MT_CHECK(!prepared_ && index >= 0, "Executor::set_main_stream({}) after prepare()", index);
  main_stream_ = index;
}

void Executor::after_node(NodeId node, std::function<void(Stream&)> hook) {
  MT_CHECK(!prepared_ && node >= 0 && node < graph_.num_nodes(),
           "Executor::after_node(%{}) after prepare() or outside the graph", node);
  hooks_.emplace_back(node, std::move(hook));
}

const Tensor& Executor::tensor(ValueId v) const {
  MT_CHECK(prepared_, "Executor::tensor before prepare()");
  const Tensor& t = tensors_.at(size_t(v));
  MT_CHECK(t.defined(), "value %{} ({}) has no memory (dead, or never used)", v,
           graph_.value(v).name);
  return t;
}

void Executor::prepare() {
  MT_CHECK(!prepared_, "Executor::prepare called twice");
  Allocator& alloc = backend_.allocator();
  // The only allocations of the run: one arena for activations and scratch, one input region.
  arena_ = std::make_shared<Storage>(alloc, size_t(std::max<int64_t>(plan_.arena_bytes, 256)));
  inputs_ = std::make_shared<Storage>(alloc, size_t(std::max<int64_t>(plan_.input_bytes, 256)));
  auto at = [&](const std::shared_ptr<Storage>& base, int64_t offset, const TensorMeta& m) {
    return Tensor(base, size_t(offset), m.shape, m.dtype);
  };

  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    const Value& val = graph_.value(v);
    switch (plan_.region[size_t(v)]) {
      case MemRegion::kArena:
        tensors_[size_t(v)] = at(arena_, plan_.offset[size_t(v)], val.meta);
        break;
      case MemRegion::kInput:
        tensors_[size_t(v)] = at(inputs_, plan_.offset[size_t(v)], val.meta);
        break;
      case MemRegion::kPersistent:
        if (val.alias_of != kNoValue) {
          const Tensor& root = tensors_.at(size_t(val.alias_of));
          MT_CHECK(root.defined(), "persistent value {} was not bound",
                   graph_.value(val.alias_of).name);
          tensors_[size_t(v)] = root.view(val.meta.shape);
        } else {
          MT_CHECK(tensors_[size_t(v)].defined(), "persistent {} '{}' was not bound before prepare",
                   value_role_name(val.role), val.name);
        }
        break;
      case MemRegion::kNone: break;
    }
  }

  int max_stream = 0;
  for (NodeId id : plan_.schedule) max_stream = std::max(max_stream, graph_.node(id).stream);
  backend_.ensure_streams(std::max(max_stream, main_stream_) + 1);
  MT_CHECK(main_stream_ == 0 || main_stream_ > max_stream,
           "executor: main stream {} is also one of the graph's side streams (1..{})", main_stream_,
           max_stream);
  auto backend_stream = [&](int graph_stream) {
    return &backend_.stream(graph_stream == 0 ? main_stream_ : graph_stream);
  };

  // Position of each node in the schedule; producer of each value.
  std::vector<int> pos_of(size_t(graph_.num_nodes()), -1);
  for (size_t p = 0; p < plan_.schedule.size(); ++p) pos_of[size_t(plan_.schedule[p])] = int(p);

  const OpRegistry& reg = OpRegistry::instance();
  const DeviceType dev = backend_.device().type;
  steps_.reserve(plan_.schedule.size());
  for (NodeId id : plan_.schedule) {
    const Node& n = graph_.node(id);
    Step s;
    s.node = id;
    s.fn = reg.make_kernel(n, graph_, dev, services_);
    s.ctx.node = &n;
    for (ValueId v : n.inputs) s.ctx.in.push_back(tensors_[size_t(v)]);
    for (ValueId v : n.outputs) s.ctx.out.push_back(tensors_[size_t(v)]);
    if (plan_.workspace_bytes[size_t(id)] > 0)
      // Workspace is raw bytes; kernels reinterpret it (view_as) as they need.
      s.ctx.workspace = Tensor(arena_, size_t(plan_.workspace_offset[size_t(id)]),
                               Shape{(plan_.workspace_bytes[size_t(id)] + 3) / 4}, DType::kI32);
    s.ctx.stream = backend_stream(n.stream);
    for (auto& [hook_node, hook] : hooks_)
      if (hook_node == id) s.hooks.push_back(hook);
    s.ctx.services = services_;
    s.ctx.scalars = &scalars_;
    steps_.push_back(std::move(s));
  }
  for (auto& [hook_node, hook] : hooks_)
    MT_CHECK(pos_of[size_t(hook_node)] >= 0,
             "executor: after_node hook on %{} ({}), which the "
             "schedule does not run",
             hook_node, graph_.node(hook_node).op);
  hooks_.clear();

  // Cross-stream dependencies: (a) a node waits for producers of its inputs on other streams;
  // (b) a block that reuses arena bytes waits for the last readers of earlier occupants on other
  // streams. The step that must signal records an event after it runs.
  std::map<int, Event*> done_event;  // schedule position -> event
  auto event_after = [&](int p) {
    auto it = done_event.find(p);
    if (it != done_event.end()) return it->second;
    events_.push_back(backend_.create_event(false));
    Event* e = events_.back().get();
    done_event[p] = e;
    steps_[size_t(p)].done = e;
    return e;
  };
  auto add_wait = [&](int p, int dep) {
    if (dep < 0 || graph_.node(plan_.schedule[size_t(dep)]).stream ==
                       graph_.node(plan_.schedule[size_t(p)]).stream)
      return;
    Event* e = event_after(dep);
    auto& w = steps_[size_t(p)].waits;
    if (std::find(w.begin(), w.end(), e) == w.end()) w.push_back(e);
  };
  auto consumers = graph_.consumers();
  for (size_t p = 0; p < plan_.schedule.size(); ++p) {
    const Node& n = graph_.node(plan_.schedule[p]);
    for (ValueId v : n.inputs) {
      NodeId prod = graph_.value(v).producer;
      if (prod >= 0) add_wait(int(p), pos_of[size_t(prod)]);
    }
  }
  if (max_stream > 0) {
    // Arena reuse: for blocks A (earlier) and B (later) overlapping in bytes with A.last < B.first,
    // B's first writer waits for every position in [A.first, A.last] on another stream that
    // touched A. Checking A's last user per stream is enough since streams are in order.
    std::vector<const ArenaBlock*> blocks;
    for (const ArenaBlock& b : plan_.blocks) blocks.push_back(&b);
    std::vector<std::vector<ValueId>> views_of(size_t(graph_.num_values()));
    for (ValueId v = 0; v < graph_.num_values(); ++v)
      views_of[size_t(storage_root(graph_, v))].push_back(v);
    std::vector<std::vector<int>> users(plan_.blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const ArenaBlock& b = *blocks[i];
      if (b.value == kNoValue) {
        users[i].push_back(b.first);
        continue;
      }
      for (ValueId v : views_of[size_t(b.value)]) {
        NodeId prod = graph_.value(v).producer;
        if (prod >= 0 && pos_of[size_t(prod)] >= 0) users[i].push_back(pos_of[size_t(prod)]);
        for (NodeId c : consumers[size_t(v)]) users[i].push_back(pos_of[size_t(c)]);
      }
    }
    for (size_t i = 0; i < blocks.size(); ++i)
      for (size_t j = 0; j < blocks.size(); ++j) {
        const ArenaBlock& a = *blocks[i];
        const ArenaBlock& b = *blocks[j];
        if (a.last >= b.first) continue;
        if (a.offset >= b.offset + b.bytes || b.offset >= a.offset + a.bytes) continue;
        std::map<int, int> last_per_stream;
        for (int u : users[i]) {
          int st = graph_.node(plan_.schedule[size_t(u)]).stream;
          last_per_stream[st] = std::max(last_per_stream[st], u);
        }
        for (auto [st, u] : last_per_stream) add_wait(b.first, u);
      }
  }
  std::vector<KernelContext*> contexts;
  for (Step& s : steps_) contexts.push_back(&s.ctx);
  row_pools_ = std::make_unique<RowCapacityPools>(graph_, plan_, backend_, std::move(contexts));
  // The events that order a run as a whole (see run()).
  if (max_stream > 0) run_started_ = backend_.create_event(false);
  for (int st = 1; st <= max_stream; ++st) {
    side_streams_.push_back(&backend_.stream(st));
    side_done_.push_back(backend_.create_event(false));
  }
  prepared_ = true;
}

int Executor::wait_for_external_writes(const std::vector<ExternalWrite>& writes) {
  MT_CHECK(prepared_, "Executor::wait_for_external_writes before prepare()");
  // (stream, event) already waited for: a later node on that stream runs after the wait, whichever
  // of the event's ranges it touches.
  std::set<std::pair<const Stream*, const Event*>> seen;
  int added = 0;
  for (Step& s : steps_) {
    auto touch = [&](const Tensor& t) {
      if (!t.defined() || t.nbytes() == 0) return;
      const uintptr_t lo = reinterpret_cast<uintptr_t>(t.raw()), hi = lo + t.nbytes();
      for (const ExternalWrite& w : writes) {
        if (w.end <= lo || hi <= w.begin || !seen.insert({s.ctx.stream, w.done}).second) continue;
        s.waits.push_back(w.done);
        ++added;
      }
    };
    for (const Tensor& t : s.ctx.in) touch(t);
    for (const Tensor& t : s.ctx.out) touch(t);
  }
  return added;
}

void Executor::run() {
  MT_CHECK(prepared_, "Executor::run before prepare()");
  // Without this, the next micro-batch's first gathers on a communication stream could
  // overwrite arena bytes this run's last backward nodes on stream 0 still read (and the
  // reverse), since the waits below order nodes within one run only.
  Stream& main = backend_.stream(main_stream_);
  if (run_started_) {
    run_started_->record(main);
    for (Stream* st : side_streams_) run_started_->wait(*st);
  }
  for (Step& s : steps_) {
    const Node& n = graph_.node(s.node);
    // Stream waits: ordering computed in prepare(); see the comment there.
    for (Event* e : s.waits) e->wait(*s.ctx.stream);
    if (observer_) observer_->before(n, *s.ctx.stream);
    try {
      s.fn(s.ctx);
    } catch (const Error& e) {
      throw Error(e.kind(),
                  fmt::format("while running {} at '{}' ({}): {}", n.op, n.scope,
                              node_phase_name(n.phase), e.message()),
                  __FILE__, __LINE__);
    }
    if (observer_) observer_->after(n, *s.ctx.stream);
    for (auto& hook : s.hooks) hook(*s.ctx.stream);
    if (s.done) s.done->record(*s.ctx.stream);
  }
  for (size_t i = 0; i < side_streams_.size(); ++i) {
    side_done_[i]->record(*side_streams_[i]);
    side_done_[i]->wait(main);
  }
}

}  // namespace meshtrain
