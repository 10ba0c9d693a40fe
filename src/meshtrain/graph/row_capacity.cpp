// Row-capacity pools (see row_capacity.h): followers found by shape inference at prepare, pools
// grown at the source's host sync point, bindings swapped in the executor's kernel contexts.
#include "meshtrain/graph/row_capacity.h"

#include <algorithm>

namespace meshtrain {
namespace {

int64_t align_up(int64_t x) {
  return (x + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
}

Shape with_rows(const Shape& s, int64_t rows) {
  std::vector<int64_t> d = s.dims();
  d.at(0) = rows;
  return Shape(d);
}

}  // namespace

class RowCapacityGroup final : public RowCapacity {
 public:
  RowCapacityGroup(Backend& backend, int64_t planned, std::string scope)
      : backend_(backend), planned_(planned), scope_(std::move(scope)) {}

  // A piece of the pool: bytes(R) = base + per_row · R. Values have base 0; scratch that grows
  // with the rows has the affine size its kernel reports.
  struct Piece {
    int64_t base = 0, per_row = 0;
    ValueId value = kNoValue;  // kNoValue: a node's workspace
    Shape shape;               // the value's planned shape (rows = planned)
    DType dtype = DType::kI32;
    int view_of = -1;  // >= 0: a view of that piece (no bytes of its own)
  };
  struct Binding {
    RowCapacityPools::Site site;
    int piece;
    Tensor planned;  // the arena tensor, restored when a step fits the plan again
  };

  int add_value(ValueId v, const TensorMeta& m, int view_of) {
    pieces_.push_back(Piece{0, int64_t(m.nbytes()) / std::max<int64_t>(planned_, 1), v, m.shape,
                            m.dtype, view_of});
    return int(pieces_.size()) - 1;
  }
  int add_workspace(int64_t planned_bytes, int64_t probe_bytes, int64_t probe_rows) {
    const int64_t slope = (probe_bytes - planned_bytes + (probe_rows - planned_) - 1) /
                          std::max<int64_t>(probe_rows - planned_, 1);
    pieces_.push_back(Piece{std::max<int64_t>(planned_bytes - slope * planned_, 0), slope});
    return int(pieces_.size()) - 1;
  }
  void add_binding(RowCapacityPools::Site s, int piece) {
    bindings_.push_back(Binding{s, piece, tensor_at(s)});
  }

  int64_t planned_rows() const override { return planned_; }

  int64_t fit(int64_t rows, int64_t most) override {
    ++stats_.fits;
    stats_.max_fill =
        std::max(stats_.max_fill, double(rows) / double(std::max<int64_t>(planned_, 1)));
    if (rows <= planned_) {
      if (in_pool_) bind_planned();
      return planned_;
    }
    ++stats_.overflows;
    if (rows > pool_rows_) {
      // Grow with headroom (a quarter more than this step needs, or than the pool held) so that
      // a load that varies a little does not reallocate every step; never past the worst case.
      const int64_t want = std::max(rows + rows / 4, pool_rows_ + pool_rows_ / 4);
      const int64_t grown = std::max(rows, std::min(most, (want + 63) / 64 * 64));
      // The old pool may still be read by queued kernels of an earlier micro-batch: wait for the
      // device before releasing it (a step that overflows its plan, never an ordinary one).
      backend_.synchronize();
      if (in_pool_) bind_planned();
      pool_.reset();
      pool_ = std::make_shared<Storage>(backend_.allocator(), size_t(pool_bytes(grown)));
      pool_rows_ = grown;
      ++stats_.grows;
      stats_.pool_bytes = int64_t(pool_->bytes());
      make_pool_tensors();
    }
    if (!in_pool_) bind_pool();
    return pool_rows_;
  }

  const RowCapacityStats& stats() const { return stats_; }
  bool empty() const { return bindings_.empty(); }

 private:
  static Tensor& slot(const RowCapacityPools::Site& s) {
    switch (s.kind) {
      case RowCapacityPools::Site::kIn: return s.ctx->in.at(size_t(s.slot));
      case RowCapacityPools::Site::kOut: return s.ctx->out.at(size_t(s.slot));
      case RowCapacityPools::Site::kWorkspace: break;
    }
    return s.ctx->workspace;
  }
  static Tensor tensor_at(const RowCapacityPools::Site& s) { return slot(s); }

  int64_t pool_bytes(int64_t rows) const {
    int64_t total = 0;
    for (const Piece& p : pieces_)
      if (p.view_of < 0) total += align_up(p.base + p.per_row * rows);
    return std::max<int64_t>(total, MemoryPlan::kAlignment);
  }

  void make_pool_tensors() {
    pool_tensors_.assign(pieces_.size(), Tensor());
    int64_t at = 0;
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const Piece& p = pieces_[i];
      if (p.view_of >= 0) {
        pool_tensors_[i] = pool_tensors_[size_t(p.view_of)].view(with_rows(p.shape, pool_rows_));
        continue;
      }
      const int64_t bytes = p.base + p.per_row * pool_rows_;
      if (p.value == kNoValue)
        pool_tensors_[i] = Tensor(pool_, size_t(at), Shape{(bytes + 3) / 4}, DType::kI32);
      else
        pool_tensors_[i] = Tensor(pool_, size_t(at), with_rows(p.shape, pool_rows_), p.dtype);
      at += align_up(bytes);
    }
  }
  void bind_pool() {
    for (const Binding& b : bindings_) slot(b.site) = pool_tensors_[size_t(b.piece)];
    in_pool_ = true;
  }
  void bind_planned() {
    for (const Binding& b : bindings_) slot(b.site) = b.planned;
    in_pool_ = false;
  }

  Backend& backend_;
  int64_t planned_;
  std::string scope_;
  std::vector<Piece> pieces_;
  std::vector<Binding> bindings_;
  std::shared_ptr<Storage> pool_;
  std::vector<Tensor> pool_tensors_;
  int64_t pool_rows_ = 0;
  bool in_pool_ = false;
  RowCapacityStats stats_;
};

RowCapacityPools::RowCapacityPools(const Graph& graph, const MemoryPlan& plan, Backend& backend,
                                   std::vector<KernelContext*> contexts) {
  const OpRegistry& reg = OpRegistry::instance();
  const DeviceType dev = backend.device().type;
  for (size_t sp = 0; sp < plan.schedule.size(); ++sp) {
    const Node& src = graph.node(plan.schedule[sp]);
    if (!reg.op(src.op).capacity_source) continue;
    auto from_src = [&](ValueId v) { return graph.value(v).producer == src.id; };
    // Seeds: outputs whose rows follow this source; all planned at the same capacity.
    int64_t planned = -1;
    for (NodeId id : plan.schedule) {
      const Node& n = graph.node(id);
      const int k = reg.op(n.op).capacity_from_input;
      if (k < 0 || !from_src(n.inputs.at(size_t(k)))) continue;
      const int64_t rows = graph.value(n.outputs.at(0)).meta.shape[0];
      MT_CHECK(planned < 0 || planned == rows,
               "row capacity of {} at '{}': its followers are planned at {} and {} rows", src.op,
               src.scope, planned, rows);
      planned = rows;
    }
    if (planned <= 0) continue;
    const int64_t probe = 2 * planned;
    auto group = std::make_unique<RowCapacityGroup>(backend, planned, src.scope);
    std::vector<int> piece_of(size_t(graph.num_values()), -1);
    for (size_t p = sp + 1; p < plan.schedule.size(); ++p) {
      const Node& n = graph.node(plan.schedule[p]);
      const OpDef& def = reg.op(n.op);
      const bool seed =
          def.capacity_from_input >= 0 && from_src(n.inputs.at(size_t(def.capacity_from_input)));
      bool touches = seed;
      std::vector<TensorMeta> ins, planned_outs;
      for (ValueId v : n.inputs) {
        TensorMeta m = graph.value(v).meta;
        if (piece_of[size_t(v)] >= 0) {
          m.shape = with_rows(m.shape, probe);
          touches = true;
        }
        ins.push_back(m);
      }
      if (!touches) continue;
      for (ValueId v : n.outputs) planned_outs.push_back(graph.value(v).meta);
      std::vector<TensorMeta> outs = planned_outs;
      if (seed) {
        outs[0].shape = with_rows(outs[0].shape, probe);
      } else {
        try {
          outs = def.infer(ins, n.attrs);
        } catch (const Error& e) {
          MT_THROW(ConfigError,
                   "expert capacity: rows that follow {} at '{}' reach {} at '{}', whose shapes "
                   "cannot take more rows than planned ({}); raise "
                   "[parallelism] expert_capacity_factor to the worst case or report this",
                   src.op, src.scope, n.op, n.scope, e.message());
        }
      }
      for (size_t j = 0; j < n.outputs.size(); ++j) {
        const TensorMeta& a = planned_outs[j];
        if (outs[j] == a) continue;
        const bool rows_only = a.shape.rank() >= 1 && outs[j].shape.rank() == a.shape.rank() &&
                               a.shape[0] == planned && outs[j].shape[0] == probe &&
                               with_rows(outs[j].shape, planned) == a.shape;
        MT_CHECK_T(ConfigError, rows_only,
                   "expert capacity: {} at '{}' turns {} rows into output {} of shape {} (planned "
                   "{}): only the row count may follow the exchange",
                   n.op, n.scope, probe, j, outs[j].shape, a.shape);
        const ValueId v = n.outputs[j];
        if (plan.region[size_t(v)] != MemRegion::kArena) continue;
        int view_of = -1;
        const ValueId root = storage_root(graph, v);
        if (root != v) {
          view_of = piece_of[size_t(root)];
          MT_CHECK_T(ConfigError,
                     view_of >= 0 && plan.offset[size_t(v)] == plan.offset[size_t(root)],
                     "expert capacity: {} at '{}' makes a view of expert rows at an offset", n.op,
                     n.scope);
        }
        piece_of[size_t(v)] = group->add_value(v, a, view_of);
      }
      KernelContext* ctx = contexts.at(p);
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (piece_of[size_t(n.inputs[i])] >= 0)
          group->add_binding({ctx, Site::kIn, int(i)}, piece_of[size_t(n.inputs[i])]);
      for (size_t j = 0; j < n.outputs.size(); ++j)
        if (piece_of[size_t(n.outputs[j])] >= 0)
          group->add_binding({ctx, Site::kOut, int(j)}, piece_of[size_t(n.outputs[j])]);
      const int64_t ws = plan.workspace_bytes[size_t(n.id)];
      const int64_t ws_probe = int64_t(reg.workspace_bytes(n, dev, ins, outs));
      if (ws_probe > ws)
        group->add_binding({ctx, Site::kWorkspace, 0}, group->add_workspace(ws, ws_probe, probe));
    }
    if (group->empty()) continue;
    contexts.at(sp)->capacity = group.get();
    groups_.push_back(std::move(group));
  }
}

RowCapacityPools::~RowCapacityPools() = default;

RowCapacityStats RowCapacityPools::stats() const {
  RowCapacityStats s;
  for (const auto& g : groups_) {
    const RowCapacityStats& a = g->stats();
    s.fits += a.fits;
    s.overflows += a.overflows;
    s.grows += a.grows;
    s.pool_bytes += a.pool_bytes;
    s.max_fill = std::max(s.max_fill, a.max_fill);
  }
  return s;
}

}  // namespace meshtrain
