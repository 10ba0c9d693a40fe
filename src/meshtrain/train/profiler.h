// Profiler: device-side timing of every node an Executor runs, written as one Chrome trace per
// rank (chrome://tracing, Perfetto). Events are made once, at construction: a pair of timing
// events per schedule entry and micro-batch, recorded on the node's own stream before and after
// it (CUDA events on GPUs, wall-clock stamps on the CPU backend, whose kernels are synchronous).
// Only profiled steps attach it to the executor, so other steps pay nothing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/graph/executor.h"

namespace meshtrain {

class Profiler final : public NodeObserver {
 public:
  // `runs_per_step`: how many times the executor runs in one step (micro-batches).
  Profiler(Backend& backend, const Executor& exec, int runs_per_step, int rank);
  ~Profiler() override;

  // Starts recording a step (call before the first run of the step).
  void begin_step();
  void before(const Node& node, Stream& stream) override;
  void after(const Node& node, Stream& stream) override;
  // Waits for the device, then writes <folder>/iteration_<step>/rank<R>_trace.json: one
  // complete event ("ph": "X") per recorded node, named by its op, with scope, phase, shapes and
  // micro-batch in args; one track per stream ("compute" or the mesh group whose collectives run
  // there). Returns the file's path.
  std::string write_trace(const std::string& folder, int64_t step);

  int recorded() const { return next_; }
  // The trace's track name of a stream of this executor's graph.
  std::string stream_name(int stream) const;

 private:
  struct Record {
    const Node* node = nullptr;
    int stream = 0;
    int run = 0;
    std::unique_ptr<Event> start, end;
  };
  Backend& backend_;
  const Executor& exec_;
  int rank_;
  int runs_per_step_;
  std::vector<Record> records_;
  int next_ = 0;
  int64_t schedule_size_ = 0;
  std::vector<std::string> stream_names_;
};

}  // namespace meshtrain
