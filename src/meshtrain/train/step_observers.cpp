// The step observers: the profiler around chosen steps, the debug dump of one step.
#include "meshtrain/train/step_observers.h"

#include <algorithm>

namespace meshtrain {

void StepObservers::before_step(int64_t step) {
  for (auto& o : list_) o->before_step(step);
}
void StepObservers::after_backward(int64_t step) {
  for (auto& o : list_) o->after_backward(step);
}
void StepObservers::after_step(const StepRecord& r) {
  for (auto& o : list_) o->after_step(r);
}

namespace {

class ProfilingObserver final : public StepObserver {
 public:
  ProfilingObserver(std::unique_ptr<Profiler> p, Executor& exec, int64_t every, std::string folder)
      : profiler_(std::move(p)),
        exec_(exec),
        every_(std::max<int64_t>(1, every)),
        folder_(std::move(folder)) {}
  void before_step(int64_t step) override {
    active_ = step % every_ == 0;
    if (!active_) return;
    profiler_->begin_step();
    exec_.set_observer(profiler_.get());  // events around every node of this step's runs
  }
  void after_backward(int64_t step) override {
    if (!active_) return;
    exec_.set_observer(nullptr);
    profiler_->write_trace(folder_, step);
    active_ = false;
  }

 private:
  std::unique_ptr<Profiler> profiler_;
  Executor& exec_;
  int64_t every_;
  std::string folder_;
  bool active_ = false;
};

class DebugDumpObserver final : public StepObserver {
 public:
  DebugDumpObserver(std::unique_ptr<DebugDump> dump, DebugDumpSources s)
      : dump_(std::move(dump)), s_(std::move(s)) {}
  void before_step(int64_t step) override {
    if (dump_->at(step)) dump_->weights(s_.run());
  }
  void after_backward(int64_t step) override {
    if (dump_->at(step)) dump_->gradients(s_.run());
  }
  void after_step(const StepRecord& r) override {
    if (!dump_->at(r.step)) return;
    if (!s_.writes_summary) return;
    std::vector<std::pair<std::string, std::vector<double>>> loads;
    for (MoeLayerLoad& l : s_.loads()) loads.emplace_back(l.layer, std::move(l.tokens));
    DumpStepInfo info = s_.fixed;
    info.step = r.step;
    info.window_begin = (r.step - 1) * info.rows_per_step;
    info.loss = r.loss;
    info.grad_norm = r.grad_norm;
    info.lr = r.lr;
    dump_->summary(info, loads);
  }

 private:
  std::unique_ptr<DebugDump> dump_;
  DebugDumpSources s_;
};

}  // namespace

std::unique_ptr<StepObserver> make_profiling_observer(std::unique_ptr<Profiler> profiler,
                                                      Executor& exec, int64_t every,
                                                      std::string folder) {
  return std::make_unique<ProfilingObserver>(std::move(profiler), exec, every, std::move(folder));
}

std::unique_ptr<StepObserver> make_debug_dump_observer(std::unique_ptr<DebugDump> dump,
                                                       DebugDumpSources sources) {
  return std::make_unique<DebugDumpObserver>(std::move(dump), std::move(sources));
}

}  // namespace meshtrain
