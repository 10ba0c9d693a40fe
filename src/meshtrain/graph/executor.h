// Executor: binds every value of a planned graph to memory once (one arena allocation, one input
// region, persistent tensors bound by their owners), resolves each node's kernel once, then runs
// the schedule every step without allocating. Cross-stream order is kept with events computed at
// prepare time (producer->consumer edges and arena reuse across streams). Expert-exchange rows
// beyond the plan are rebound to a pool at the exchange's host sync point (row_capacity.h).
// Work of another executor that runs beside this one (the optimizer's update beside the next
// step) is ordered with external writes: byte ranges and the event recorded after their writer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/row_capacity.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

// Optional per-node timing hook (the profiler): called around each node with the node's stream.
class NodeObserver {
 public:
  virtual ~NodeObserver() = default;
  virtual void before(const Node& node, Stream& stream) = 0;
  virtual void after(const Node& node, Stream& stream) = 0;
};

// Memory another executor writes, [begin, end) in bytes, and the event recorded after the writes.
struct ExternalWrite {
  Event* done = nullptr;
  uintptr_t begin = 0, end = 0;
};

class Executor {
 public:
  Executor(const Graph& graph, MemoryPlan plan, Backend& backend, ExecServices* services);
  ~Executor();

  // Persistent values (parameters, gradients, state) must be bound before prepare().
  void bind(ValueId v, Tensor t);
  // The backend stream that runs the graph's stream 0 (default 0), before prepare(): the optimizer
  // runs on its own stream beside the next step (optim/optimizer.h). The other streams keep
  // their numbers.
  void set_main_stream(int index);
  // Calls hook(stream) right after `node` runs, on the node's stream (to enqueue a copy or record
  // an event at that point of the run).
  void after_node(NodeId node, std::function<void(Stream&)> hook);
  void prepare();
  // After prepare(): on each stream, the first node that reads or writes bytes of a write waits
  // for its event first, every run (an event never recorded is no wait). Returns how many waits
  // that added.
  int wait_for_external_writes(const std::vector<ExternalWrite>& writes);
  // Enqueues one run of the graph. A run is ordered as a whole after the work enqueued before it
  // on stream 0 and before the work enqueued after it there: the other streams wait for stream 0
  // when it starts and stream 0 waits for them when it ends, so runs back to back (the
  // micro-batches of a step) never overlap on the arena.
  void run();

  // The tensor a value is bound to (inputs to fill, outputs to read). Valid after prepare().
  const Tensor& tensor(ValueId v) const;
  // Host scalar read by kernels at launch (see Graph::add_scalar).
  void set_scalar(int slot, double value) { scalars_.at(size_t(slot)) = value; }
  const Graph& graph() const { return graph_; }
  const MemoryPlan& plan() const { return plan_; }
  Backend& backend() { return backend_; }
  void set_observer(NodeObserver* obs) { observer_ = obs; }
  // Expert-exchange rows beyond the plan since prepare (row_capacity.h); zeros without EP.
  RowCapacityStats row_capacity_stats() const {
    return row_pools_ ? row_pools_->stats() : RowCapacityStats{};
  }

 private:
  struct Step {
    NodeId node;
    KernelFn fn;
    KernelContext ctx;
    std::vector<Event*> waits;  // events this node's stream waits on before running
    Event* done = nullptr;      // recorded after the node when another stream depends on it
    std::vector<std::function<void(Stream&)>> hooks;  // after_node's, in the order given
  };
  const Graph& graph_;
  MemoryPlan plan_;
  Backend& backend_;
  ExecServices* services_;
  NodeObserver* observer_ = nullptr;
  int main_stream_ = 0;
  std::vector<std::pair<NodeId, std::function<void(Stream&)>>> hooks_;  // until prepare()
  std::vector<Tensor> tensors_;
  std::vector<double> scalars_;
  std::shared_ptr<Storage> arena_;
  std::shared_ptr<Storage> inputs_;
  std::vector<Step> steps_;
  std::vector<std::unique_ptr<Event>> events_;
  // The streams other than 0 that the graph uses, the event they wait for at a run's start, and
  // one per stream that stream 0 waits for at its end.
  std::vector<Stream*> side_streams_;
  std::unique_ptr<Event> run_started_;
  std::vector<std::unique_ptr<Event>> side_done_;
  std::unique_ptr<RowCapacityPools> row_pools_;  // rebinds steps_' contexts: declared after them
  bool prepared_ = false;
};

}  // namespace meshtrain
