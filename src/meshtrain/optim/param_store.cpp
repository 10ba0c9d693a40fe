// ParamStore: flat buffers per norm group; initialisation on the host, then copied to the device;
// the compute copies cast from the masters by a one-node-per-group graph.
#include "meshtrain/optim/param_store.h"

#include <map>

#include "meshtrain/core/progress.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {

std::vector<ParamGroup> layout_param_groups(const ParallelPlan& plan) {
  const auto& ps = plan.params();
  const DType dt = plan.config().master_dtype;
  // Each parameter starts 256-byte aligned inside its flat buffer (vector loads, cuBLAS).
  const int64_t align = std::max<int64_t>(1, 256 / int64_t(dtype_size(dt)));
  std::vector<ParamGroup> groups;
  std::map<std::vector<MeshGroup>, size_t> by_groups;  // groups keep first-seen order
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i].trainable) continue;
    auto it = by_groups.find(ps[i].shard_groups);
    if (it == by_groups.end()) {
      it = by_groups.emplace(ps[i].shard_groups, groups.size()).first;
      groups.push_back(ParamGroup{.norm_groups = ps[i].shard_groups});
    }
    ParamGroup& g = groups[it->second];
    g.numel = (g.numel + align - 1) / align * align;
    g.params.push_back(i);
    g.offsets.push_back(g.numel);
    g.numel += ps[i].local_shape.numel();
    if (ps[i].compute != kNoValue) {
      g.has_compute = true;
      g.compute_dtype = plan.config().compute_dtype;  // ParallelPlan::param's rule
    }
  }
  return groups;
}

ParamStore::ParamStore(const ParallelPlan& plan, Backend& backend)
    : plan_(plan), backend_(backend), groups_(layout_param_groups(plan)) {
  const auto& ps = plan.params();
  group_of_.assign(ps.size(), -1);
  offset_of_.assign(ps.size(), 0);
  state_.resize(ps.size());
  const DType dt = plan.config().master_dtype;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t k = 0; k < groups_[gi].params.size(); ++k) {
      group_of_[groups_[gi].params[k]] = int(gi);
      offset_of_[groups_[gi].params[k]] = groups_[gi].offsets[k];
    }
  Allocator& alloc = backend.allocator();
  for (ParamGroup& g : groups_) {
    Shape s{std::max<int64_t>(g.numel, 1)};
    for (Tensor* t : {&g.master, &g.grad, &g.exp_avg, &g.exp_avg_sq}) {
      *t = Tensor::empty(s, dt, alloc);
      backend.fill_zero(t->raw(), t->nbytes(), backend.stream(0));
    }
    if (g.has_compute) {
      g.compute = Tensor::empty(s, g.compute_dtype, alloc);
      backend.fill_zero(g.compute.raw(), g.compute.nbytes(), backend.stream(0));
    }
  }
  for (size_t i = 0; i < ps.size(); ++i)
    if (!ps[i].trainable) state_[i] = Tensor::empty(ps[i].local_shape, ps[i].dtype, alloc);
  build_refresh();
}

ParamStore::~ParamStore() = default;

void ParamStore::build_refresh() {
  Builder b(refresh_graph_, NodePhase::kOptimizer);
  std::vector<std::pair<ValueId, Tensor>> binds;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const ParamGroup& g = groups_[i];
    if (!g.has_compute) continue;
    const Shape s = g.master.shape();
    const std::string tag = "group" + std::to_string(i);
    ValueId m = b.persistent(tag + ".master", {s, g.master.dtype()}, ValueRole::kParameter);
    ValueId c = b.persistent(tag + ".compute", {s, g.compute_dtype}, ValueRole::kComputeCopy);
    ops::cast_into(b, c, m);
    binds.emplace_back(m, g.master);
    binds.emplace_back(c, g.compute);
  }
  if (binds.empty()) return;
  refresh_ = std::make_unique<Executor>(
      refresh_graph_, plan_memory(refresh_graph_, backend_.device().type), backend_, nullptr);
  for (const auto& [v, t] : binds) refresh_->bind(v, t);
  refresh_->prepare();
}

bool ParamStore::has_compute_copies() const { return refresh_ != nullptr; }

void ParamStore::sync_compute_copies() {
  if (!copies_stale_) return;
  if (refresh_) refresh_->run();
  copies_stale_ = false;
}

Tensor ParamStore::master(const std::string& name) const {
  const ParamInfo& p = plan_.info(name);
  size_t i = size_t(&p - plan_.params().data());
  if (!p.trainable) return state_[i];
  return view(name, &ParamGroup::master, "master");
}

Tensor ParamStore::view(const std::string& name, Tensor ParamGroup::*buffer,
                        const char* what) const {
  const ParamInfo& p = plan_.info(name);
  size_t i = size_t(&p - plan_.params().data());
  MT_CHECK(p.trainable, "{} is not trainable; it has no {}", name, what);
  const ParamGroup& g = groups_[size_t(group_of_[i])];
  return Tensor((g.*buffer).storage(), size_t(offset_of_[i]) * dtype_size(p.dtype), p.local_shape,
                p.dtype);
}

Tensor ParamStore::grad(const std::string& name) const {
  return view(name, &ParamGroup::grad, "gradient");
}
Tensor ParamStore::exp_avg(const std::string& name) const {
  return view(name, &ParamGroup::exp_avg, "exp_avg");
}
Tensor ParamStore::exp_avg_sq(const std::string& name) const {
  return view(name, &ParamGroup::exp_avg_sq, "exp_avg_sq");
}
Tensor ParamStore::compute_copy(const std::string& name) const {
  const ParamInfo& p = plan_.info(name);
  MT_CHECK(p.compute != kNoValue, "{} has no compute copy (not trainable, or computed in {})", name,
           p.dtype);
  const size_t i = size_t(&p - plan_.params().data());
  const ParamGroup& g = groups_[size_t(group_of_[i])];
  return Tensor(g.compute.storage(), size_t(offset_of_[i]) * dtype_size(g.compute_dtype),
                p.local_shape, g.compute_dtype);
}

void ParamStore::initialize(uint64_t seed) {
  // Runs before step 1: host tensors made here for device backends are freed as it goes.
  int64_t total = 0;
  for (const ParamInfo& p : plan_.params()) total += p.local_shape.numel();
  Progress progress("initialising parameters", total);
  for (const ParamInfo& p : plan_.params()) {
    Tensor dst = master(p.name);
    Tensor host = dst.device().is_cpu()
                      ? dst
                      : Tensor::empty(p.local_shape, p.dtype, backend_.host_staging_allocator());
    if (is_floating(p.dtype) && p.dtype != DType::kBF16) {
      init_local(host, p.global_shape, p.piece, p.init, seed, p.name);
    } else {
      MT_THROW(ValueError, "state buffer {} has dtype {}: only float32/float64 can be initialised",
               p.name, p.dtype);
    }
    if (!dst.device().is_cpu())
      backend_.copy(dst.raw(), host.raw(), host.nbytes(), CopyKind::kHostToDevice,
                    backend_.stream(0));
    progress.add(p.local_shape.numel());
  }
  masters_written();
  sync_compute_copies();
  backend_.synchronize();
}

Tensor ParamStore::master_to_host(const std::string& name) const {
  Tensor d = master(name);
  Tensor h = Tensor::empty(d.shape(), d.dtype());
  backend_.copy(h.raw(), d.raw(), d.nbytes(), CopyKind::kDeviceToHost, backend_.stream(0));
  backend_.synchronize();
  return h;
}

void ParamStore::bind(Executor& ex) const {
  for (const ParamInfo& p : plan_.params()) {
    if (p.master != kNoValue) ex.bind(p.master, master(p.name));
    if (p.compute != kNoValue) ex.bind(p.compute, compute_copy(p.name));
    if (p.grad != kNoValue) ex.bind(p.grad, grad(p.name));
  }
}

int64_t ParamStore::trainable_numel() const {
  int64_t n = 0;
  for (const ParamGroup& g : groups_) n += g.numel;
  return n;
}

int64_t ParamStore::bytes() const {
  int64_t b = 0;
  for (const ParamGroup& g : groups_)
    b += 4 * int64_t(g.master.nbytes()) + (g.has_compute ? int64_t(g.compute.nbytes()) : 0);
  for (const Tensor& t : state_)
    if (t.defined()) b += int64_t(t.nbytes());
  return b;
}

}  // namespace meshtrain
