// The CPU step of the tests (see cpu_step.h).
#include "cpu_step.h"

#include "meshtrain/graph/memory_plan.h"

namespace meshtrain::testing {

CpuStep cpu_step(const JobConfig& cfg, const StepGraphOptions& options, uint64_t seed) {
  CpuStep s;
  s.sg = build_step_graph(cfg, nullptr, options);
  // The trainer reads the loss through loss_sum; these tests read each run's loss itself.
  s.sg->graph.mark_output(s.sg->loss);
  s.backend = create_backend("cpu", 0);
  s.ex = std::make_unique<Executor>(s.sg->graph, plan_memory(s.sg->graph, DeviceType::kCPU),
                                    *s.backend, nullptr);
  s.store = std::make_unique<ParamStore>(*s.sg->plan, *s.backend);
  s.store->initialize(seed);
  return s;
}

void CpuStep::prepare() {
  const TensorMeta& lm = sg->graph.value(sg->loss_sum).meta;
  loss_sum = Tensor::empty(lm.shape, lm.dtype, backend->allocator());
  backend->fill_zero(loss_sum.raw(), loss_sum.nbytes(), backend->stream(0));
  ex->bind(sg->loss_sum, loss_sum);
  store->bind(*ex);
  ex->prepare();
  ex->tensor(sg->token_count).data<int64_t>()[0] = sg->local_batch * sg->seq_len;
}

}  // namespace meshtrain::testing
