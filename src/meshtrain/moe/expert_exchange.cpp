// Expert exchange ops: definitions, and one kernel per op for every backend (the communicator
// moves rows between ranks; the regrouping is contiguous device copies on the node's stream).
#include "meshtrain/moe/expert_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/ir/op_registry.h"
#include "meshtrain/moe/dispatch.h"
#include "meshtrain/moe/host_counts.h"
#include "meshtrain/moe/padded_exchange.h"

namespace meshtrain::ops {
namespace {

void check_int_matrix(const TensorMeta& m, int64_t rows, const char* what, const char* op) {
  MT_CHECK_T(ShapeError, m.dtype == DType::kI32 && m.shape.rank() == 2 && m.shape[0] == rows,
             "{}: {} must be int32 [{}, n], found {} {}", op, what, rows, m.dtype, m.shape);
}

// A graph's padded-exchange switch and overflow counter, shared by all its MoE layers (the
// trainer flips `synced` for the replay of an overflowed step; see padded_exchange.h).
struct EpControl {
  bool synced = false;
  Tensor overflow;  // float32 [1] on the device: blocks and slots over their rows
};

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<const Graph*, std::weak_ptr<EpControl>>& controls() {
  static std::map<const Graph*, std::weak_ptr<EpControl>> c;
  return c;
}

// One MoE layer's host state, shared by its ep_counts and its exchange nodes (forward, backward
// and any recomputation: all of a micro-batch's exchanges of a layer use the counts that layer's
// ep_counts received). The host buffers come from the backend's staging allocator (pinned on
// CUDA) when the executor prepares the graph, so a step copies counts without allocating; the
// per-peer row vectors are sized there too. Written by ep_counts after its host sync, read at
// launch by the exchange kernels and (published) by the grouped GEMMs, in schedule order on the
// executor's one thread; the next micro-batch's ep_counts rewrites them only after its own sync
// of the same stream, so no earlier copy from them is still in flight.
struct EpHost {
  int ep = 1;
  int64_t experts = 0, el = 0;
  Tensor send_counts;  // [E] int32: row 1 of this rank's groups (rows per expert, all experts)
  Tensor recv;         // [ep, El] int32: rows received per (peer, local expert)
  Tensor local;        // [2, El] int32: start row / count of each local expert (published)
  std::vector<int64_t> send_rows, recv_rows;  // rows per peer, for all_to_all_v
  std::vector<int64_t> next_row;              // [El] scratch of regroup
  std::vector<int64_t> ones;                  // [ep] of 1: the count exchange's rows per peer
  std::shared_ptr<HostPublished> published;
  int64_t rows = 0;  // padded local rows of the current micro-batch
  // The padded exchange (block_rows > 0 when the graph allows it): its static slot groups
  // [2, El] (pinned), the rows per peer of its all_to_all, the graph's switch and counter.
  EpPaddedShape padded;
  Tensor slots;
  std::vector<int64_t> block;
  std::shared_ptr<EpControl> control;
  bool padded_now() const { return padded.block_rows > 0 && !control->synced; }
};

std::shared_ptr<EpHost> ep_host_of(const Graph& graph, ValueId recv_counts, ExecServices* services,
                                   const char* op) {
  MT_CHECK(services != nullptr, "{} needs the mesh's communicators (an executor with services)",
           op);
  static std::map<std::pair<const Graph*, ValueId>, std::weak_ptr<EpHost>> states;
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& slot = states[{&graph, recv_counts}];
  std::shared_ptr<EpHost> h = slot.lock();
  if (h) return h;
  const Node& counts = graph.node(graph.value(recv_counts).producer);
  const Shape rs = graph.value(recv_counts).meta.shape;  // [ep, El]
  h = std::make_shared<EpHost>();
  h->ep = int(rs[0]);
  h->el = rs[1];
  h->experts = graph.value(counts.inputs.at(0)).meta.shape[1];
  Allocator& staging = services->backend().host_staging_allocator();
  h->send_counts = Tensor::empty(Shape{h->experts}, DType::kI32, staging);
  h->recv = Tensor::empty(rs, DType::kI32, staging);
  h->local = Tensor::empty(Shape{2, h->el}, DType::kI32, staging);
  std::memset(h->local.raw(), 0, h->local.nbytes());
  h->send_rows.assign(size_t(h->ep), 0);
  h->recv_rows.assign(size_t(h->ep), 0);
  h->next_row.assign(size_t(h->el), 0);
  h->ones.assign(size_t(h->ep), 1);
  h->published = host_published_of(graph, counts.outputs.at(1));
  h->published->data = h->local.data<int32_t>();
  h->published->count = 2 * h->el;
  h->padded = EpPaddedShape{.ep = h->ep,
                            .el = h->el,
                            .block_rows = counts.attrs.i("block_rows", 0),
                            .slot_rows = counts.attrs.i("slot_rows", 0),
                            .compact_rows = counts.attrs.i("compact_rows", 0)};
  std::shared_ptr<EpControl>& control = h->control;
  control = controls()[&graph].lock();
  if (!control) {
    control = std::make_shared<EpControl>();
    controls()[&graph] = control;
  }
  if (h->padded.block_rows > 0) {
    // Expert e's slot is rows [e·C, (e + 1)·C): the groups the grouped GEMMs read, fixed.
    h->slots = Tensor::empty(Shape{2, h->el}, DType::kI32, staging);
    int32_t* g = h->slots.data<int32_t>();
    for (int64_t e = 0; e < h->el; ++e) {
      g[e] = int32_t(e * h->padded.slot_rows);
      g[h->el + e] = int32_t(h->padded.slot_rows);
    }
    h->block.assign(size_t(h->ep), h->padded.block_rows);
    if (!control->overflow.defined()) {
      control->overflow = Tensor::empty(Shape{1}, DType::kF32, services->backend().allocator());
      services->backend().fill_zero(control->overflow.raw(), 4, services->backend().stream(0));
    }
  }
  slot = h;
  return h;
}

// Moves (peer, expert) blocks between the peer-major exchange buffer and the local expert-major
// buffer: to_local copies exchange -> local, else local -> exchange.
void regroup(KernelContext& c, EpHost& h, char* exchange, char* local, size_t row_bytes,
             bool to_local) {
  Backend& be = c.services->backend();
  const int32_t* recv = h.recv.data<int32_t>();
  const int32_t* start = h.local.data<int32_t>();
  // Peer-major walk; each local expert's write position advances as its peers' blocks arrive.
  for (int64_t e = 0; e < h.el; ++e) h.next_row[size_t(e)] = start[e];
  int64_t at = 0;  // row in the peer-major buffer
  for (int q = 0; q < h.ep; ++q)
    for (int64_t e = 0; e < h.el; ++e) {
      const int64_t n = recv[q * h.el + e];
      if (n == 0) continue;
      char* x = exchange + size_t(at) * row_bytes;
      char* l = local + size_t(h.next_row[size_t(e)]) * row_bytes;
      if (to_local)
        be.copy(l, x, size_t(n) * row_bytes, CopyKind::kDeviceToDevice, *c.stream);
      else
        be.copy(x, l, size_t(n) * row_bytes, CopyKind::kDeviceToDevice, *c.stream);
      at += n;
      h.next_row[size_t(e)] += n;
    }
}

// The padded exchange's workspace follows the synced one (the peer-major buffer of `local_rows`
// rows): two blocks buffers [ep·S, D] (what is sent, what arrives), then one index map of the
// largest of the three buffers. Where it starts, for the workspace size and the kernel alike:
size_t padded_part_offset(int64_t local_rows, size_t row_bytes) {
  return (size_t(local_rows) * row_bytes + 255) / 256 * 256;
}

size_t padded_block_bytes(const EpPaddedShape& s, size_t row_bytes) {
  return (size_t(s.ep) * size_t(s.block_rows) * row_bytes + 255) / 256 * 256;
}

size_t padded_workspace_bytes(const EpPaddedShape& s, int64_t local_rows, size_t row_bytes) {
  const int64_t idx_rows = std::max({int64_t(s.ep) * s.block_rows, local_rows, s.compact_rows});
  return 2 * padded_block_bytes(s, row_bytes) + size_t(idx_rows) * 4;
}

size_t exchange_bytes(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                      const Attrs& a, bool to_experts) {
  const TensorMeta& local = to_experts ? out.at(0) : in.at(0);
  // Synced: the peer-major buffer, which never holds more rows than the local one. Padded: its
  // blocks and index map after it, apart, so that the scratch stays linear in the local rows
  // (the row-capacity pool grows it for a synced replay along that line).
  const int64_t block_rows = a.i("block_rows", 0);
  if (block_rows == 0) return local.nbytes();
  const TensorMeta& compact = to_experts ? in.at(0) : out.at(0);
  const size_t row_bytes = size_t(local.shape[1]) * dtype_size(local.dtype);
  const EpPaddedShape s{.ep = int(in.at(2).shape[0]),
                        .el = in.at(2).shape[1],
                        .block_rows = block_rows,
                        .compact_rows = compact.shape[0]};
  return padded_part_offset(local.shape[0], row_bytes) +
         padded_workspace_bytes(s, local.shape[0], row_bytes);
}

// Rows [n, D] of the workspace from byte `at`. Made on the first run; when the workspace moves
// (the row-capacity pool rebinds it to the pool or back to the arena) the view is reseated in
// place, since making a Tensor allocates its Shape, which a step must not do.
struct RowsView {
  Tensor rows;
  const Tensor& of(const Tensor& ws, size_t at, int64_t n, int64_t D, DType dt) {
    const size_t offset = ws.byte_offset() + at;
    if (!rows.defined() || rows.dtype() != dt || rows.shape()[1] != D)
      rows = Tensor(ws.storage(), offset, Shape{n, D}, dt);
    else if (rows.storage() != ws.storage() || rows.byte_offset() != offset || rows.shape()[0] != n)
      rows.reseat_rows(ws.storage(), offset, n);
    return rows;
  }
};

// The views an exchange node keeps on its workspace: the synced peer-major buffer, and the
// padded exchange's two blocks buffers.
struct ExchangeViews {
  RowsView peer_major, sent, got;
};

// One direction of the padded exchange (see padded_exchange.h): src -> blocks, all_to_all, blocks
// -> dst, all on the device with the counts the device holds.
void padded_exchange(KernelContext& c, EpHost& h, Communicator& comm, ExchangeViews& views,
                     bool to_experts) {
  Backend& be = c.services->backend();
  const EpPaddedKernels& k = ep_padded_kernels(be.device().type);
  const Tensor& src = c.in[0];
  const Tensor& dst = c.out[0];
  const int64_t D = src.shape()[1];
  const size_t row_bytes = size_t(D) * dtype_size(src.dtype());
  const int64_t block = int64_t(h.ep) * h.padded.block_rows;
  const size_t block_bytes = padded_block_bytes(h.padded, row_bytes);
  // The padded part of the workspace follows the synced one, sized for the planned local rows
  // (the count kernel has just put the buffers back at their plan).
  const int64_t local_rows = h.el * h.padded.slot_rows;
  const size_t at = padded_part_offset(local_rows, row_bytes);
  MT_CHECK(at + padded_workspace_bytes(h.padded, local_rows, row_bytes) <= c.workspace.nbytes(),
           "padded ep exchange: workspace of {} bytes, needs {}", c.workspace.nbytes(),
           at + padded_workspace_bytes(h.padded, local_rows, row_bytes));
  const Tensor& sent = views.sent.of(c.workspace, at, block, D, src.dtype());
  const Tensor& got = views.got.of(c.workspace, at + block_bytes, block, D, src.dtype());
  auto* idx =
      reinterpret_cast<int32_t*>(static_cast<char*>(c.workspace.raw()) + at + 2 * block_bytes);
  const auto* groups = c.in[1].data<int32_t>();
  const auto* recv = c.in[2].data<int32_t>();
  const EpRowMap pack = to_experts ? EpRowMap::kCompactToBlocks : EpRowMap::kSlotsToBlocks;
  const EpRowMap unpack = to_experts ? EpRowMap::kBlocksToSlots : EpRowMap::kBlocksToCompact;
  k.index(pack, h.padded, groups, recv, idx, *c.stream);
  k.gather(sent.raw(), src.raw(), idx, block, row_bytes, *c.stream);
  comm.all_to_all_v(sent, h.block, got, h.block, *c.stream);
  k.index(unpack, h.padded, groups, recv, idx, *c.stream);
  const int64_t rows = ep_padded_rows(unpack, h.padded);
  k.gather(dst.raw(), got.raw(), idx, rows, row_bytes, *c.stream);
  // Rows past the plan (the buffer still bound to a pool a synced step grew) are zeros.
  if (dst.shape()[0] > rows)
    be.fill_zero(static_cast<char*>(dst.raw()) + size_t(rows) * row_bytes,
                 size_t(dst.shape()[0] - rows) * row_bytes, *c.stream);
}

// The exchange kernels read the counts their layer's ep_counts left on the host: no copy, no
// wait here.
KernelFn exchange_kernel(const Node& node, const Graph& graph, ExecServices* services,
                         bool to_experts) {
  std::shared_ptr<EpHost> h = ep_host_of(graph, node.inputs.at(2), services,
                                         to_experts ? "ep_to_experts" : "ep_from_experts");
  const MeshGroup group = node.attrs.group();  // read once: the lookup builds strings
  auto views = std::make_shared<ExchangeViews>();
  return [h, to_experts, group, views](KernelContext& c) {
    Communicator& comm = c.services->comm(group);
    Backend& be = c.services->backend();
    MT_CHECK(comm.size() == h->ep, "ep exchange: the group has {} ranks, the counts {} peers",
             comm.size(), h->ep);
    if (h->padded_now()) {
      padded_exchange(c, *h, comm, *views, to_experts);
      return;
    }
    const Tensor& src = c.in[0];
    const Tensor& dst = c.out[0];
    const int64_t D = src.shape().numel() / std::max<int64_t>(src.shape()[0], 1);
    const size_t row_bytes = size_t(D) * dtype_size(src.dtype());
    const Tensor& xbuf = views->peer_major.of(
        c.workspace, 0, int64_t(c.workspace.nbytes() / row_bytes), D, src.dtype());
    // Padding rows and slack are zeros (moe_permute's rule); the copies then fill the data rows.
    be.fill_zero(dst.raw(), dst.nbytes(), *c.stream);
    if (to_experts) {
      comm.all_to_all_v(src, h->send_rows, xbuf, h->recv_rows, *c.stream);
      regroup(c, *h, static_cast<char*>(xbuf.raw()), static_cast<char*>(dst.raw()), row_bytes,
              true);
    } else {
      regroup(c, *h, static_cast<char*>(xbuf.raw()), static_cast<char*>(src.raw()), row_bytes,
              false);
      comm.all_to_all_v(xbuf, h->recv_rows, dst, h->send_rows, *c.stream);
    }
  };
}

// ep_counts: the count exchange on the device, then the layer's one host wait, then the local
// groups built on the host and the buffers that follow sized for them (row_capacity.h).
KernelFn counts_kernel(const Node& node, const Graph& graph, ExecServices* services) {
  std::shared_ptr<EpHost> h = ep_host_of(graph, node.outputs.at(0), services, "ep_counts");
  // Attributes read once here: a step's kernel allocates nothing.
  const MeshGroup group = node.attrs.group();
  const int64_t align = node.attrs.i("alignment"), planned = node.attrs.i("capacity");
  const int64_t worst = node.attrs.i("worst_capacity");
  auto send = std::make_shared<Tensor>();
  return [h, group, align, planned, worst, send](KernelContext& c) {
    Communicator& comm = c.services->comm(group);
    Backend& be = c.services->backend();
    MT_CHECK(comm.size() == h->ep, "ep_counts: the group has {} ranks, the graph {} peers",
             comm.size(), h->ep);
    const int ep = h->ep;
    const int64_t E = h->experts, el = h->el;
    const Tensor& groups = c.in[0];
    // Row 1 of groups is [ep, El] contiguous: peer p's block is its experts' counts.
    if (!send->defined() || send->raw() != static_cast<const char*>(groups.raw()) + size_t(E) * 4)
      *send = Tensor(groups.storage(), groups.byte_offset() + size_t(E) * 4, Shape{ep, el},
                     DType::kI32);  // once: a Shape allocates
    if (h->padded_now()) {
      // Padded: the counts stay on the device; no host wait (see padded_exchange.h). The local
      // groups are the fixed slots, and the buffers that follow are back at their plan.
      comm.all_to_all_v(*send, h->ones, c.out[0], h->ones, *c.stream);
      ep_padded_kernels(be.device().type)
          .count_overflows(h->padded, groups.data<int32_t>(), c.out[0].data<int32_t>(),
                           h->control->overflow.data<float>(), *c.stream);
      be.copy(c.out[1].raw(), h->slots.raw(), size_t(2 * el) * 4, CopyKind::kHostToDevice,
              *c.stream);
      h->published->data = h->slots.data<int32_t>();
      h->rows = el * h->padded.slot_rows;
      if (c.capacity) c.capacity->fit(h->rows, worst);
      return;
    }
    h->published->data = h->local.data<int32_t>();
    be.copy(h->send_counts.raw(), send->raw(), size_t(E) * 4, CopyKind::kDeviceToHost, *c.stream);
    comm.all_to_all_v(*send, h->ones, c.out[0], h->ones, *c.stream);
    be.copy(h->recv.raw(), c.out[0].raw(), h->recv.nbytes(), CopyKind::kDeviceToHost, *c.stream);
    // Host sync, the one of this MoE layer per micro-batch: NCCL and MPI take the per-peer row
    // counts of both exchanges on the host, and the received counts are data. The exchanges,
    // their backward and the grouped GEMMs reuse what this wait brought (no wait of their own).
    c.stream->synchronize();
    const int32_t* sc = h->send_counts.data<int32_t>();
    const int32_t* recv = h->recv.data<int32_t>();
    int32_t* local = h->local.data<int32_t>();
    for (int q = 0; q < ep; ++q) {
      int64_t ns = 0, nr = 0;
      for (int64_t e = 0; e < el; ++e) {
        ns += sc[q * el + e];
        nr += recv[q * el + e];
      }
      h->send_rows[size_t(q)] = ns;
      h->recv_rows[size_t(q)] = nr;
    }
    int64_t at = 0;
    for (int64_t e = 0; e < el; ++e) {
      int64_t n = 0;
      for (int q = 0; q < ep; ++q) n += recv[q * el + e];
      local[e] = int32_t(at);
      local[el + e] = int32_t(n);
      at += (n + align - 1) / align * align;
    }
    h->rows = at;
    // Rows beyond the plan: the buffers that follow move to a pool sized for this step (dropless).
    const int64_t bound = c.capacity ? c.capacity->fit(at, worst) : planned;
    MT_CHECK_T(ShapeError, at <= bound,
               "ep_counts: this rank receives {} expert rows but its buffers hold {} and nothing "
               "can grow them (the graph has no exchange after this count)",
               at, bound);
    // From the pinned copy: it is rewritten only after the next sync of this stream.
    be.copy(c.out[1].raw(), local, size_t(2 * el) * 4, CopyKind::kHostToDevice, *c.stream);
  };
}

}  // namespace

void set_ep_exchange_synced(const Graph& graph, bool synced) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = controls().find(&graph);
  if (it == controls().end()) return;
  if (std::shared_ptr<EpControl> c = it->second.lock()) c->synced = synced;
}

Tensor ep_overflow_counter(const Graph& graph) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = controls().find(&graph);
  if (it == controls().end()) return {};
  std::shared_ptr<EpControl> c = it->second.lock();
  return c ? c->overflow : Tensor();
}

int64_t ep_local_capacity(int ep, int64_t choices, int64_t local_experts, int64_t alignment,
                          double capacity_factor) {
  MT_CHECK_T(ConfigError, capacity_factor > 0,
             "[parallelism] expert_capacity_factor must be > 0, found {}", capacity_factor);
  const int64_t worst = moe_capacity(int64_t(ep) * choices, local_experts, alignment);
  const auto expected = int64_t(std::ceil(capacity_factor * double(choices)));
  return std::min(worst, moe_capacity(expected, local_experts, alignment));
}

EpPaddedShape ep_padded_shape(int ep, int64_t choices, int64_t local_experts, int64_t alignment,
                              double capacity_factor) {
  MT_CHECK_T(ConfigError, capacity_factor > 0,
             "[parallelism] expert_capacity_factor must be > 0, found {}", capacity_factor);
  const auto expected = [&](int64_t n) {
    return int64_t(std::ceil(capacity_factor * double(choices) / double(n)));
  };
  EpPaddedShape s{.ep = ep, .el = local_experts, .compact_rows = choices};
  // A peer's block: its share of this rank's rows with headroom, never more than all of them.
  s.block_rows = std::clamp<int64_t>(expected(ep), 1, std::max<int64_t>(choices, 1));
  // An expert's slot: its share of the rows this rank receives, never more than every block.
  const int64_t most = (int64_t(ep) * s.block_rows + alignment - 1) / alignment * alignment;
  s.slot_rows = std::min(most, (std::max<int64_t>(expected(local_experts), 1) + alignment - 1) /
                                   alignment * alignment);
  return s;
}

EpLayout ep_counts(Builder& b, ValueId groups, MeshGroup group, int ep, int64_t alignment,
                   int64_t choices, double capacity_factor, bool padded) {
  const int64_t E = b.shape(groups).rank() == 2 ? b.shape(groups)[1] : 0;
  const int64_t el = E / std::max(ep, 1);
  int64_t cap = ep_local_capacity(ep, choices, el, alignment, capacity_factor);
  EpPaddedShape s;
  if (padded && el > 0) {
    s = ep_padded_shape(ep, choices, el, alignment, capacity_factor);
    cap = el * s.slot_rows;
  }
  auto outs = b.op("ep_counts", {groups},
                   {{"group", int64_t(group)},
                    {"ep", int64_t(ep)},
                    {"alignment", alignment},
                    {"capacity", cap},
                    {"worst_capacity", moe_capacity(int64_t(ep) * choices, el, alignment)},
                    {"block_rows", s.block_rows},
                    {"slot_rows", s.slot_rows},
                    {"compact_rows", choices}});
  return EpLayout{outs[0], outs[1], cap, s.block_rows};
}

ValueId ep_to_experts(Builder& b, ValueId x_perm, ValueId groups, const EpLayout& layout,
                      MeshGroup group) {
  return b.op1("ep_to_experts", {x_perm, groups, layout.recv_counts, layout.local_groups},
               {{"group", int64_t(group)},
                {"capacity", layout.local_capacity},
                {"block_rows", layout.block_rows}});
}

ValueId ep_from_experts(Builder& b, ValueId y_local, ValueId groups, const EpLayout& layout,
                        int64_t capacity, MeshGroup group) {
  return b.op1(
      "ep_from_experts", {y_local, groups, layout.recv_counts, layout.local_groups},
      {{"group", int64_t(group)}, {"capacity", capacity}, {"block_rows", layout.block_rows}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "ep_counts",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  check_int_matrix(in.at(0), 2, "groups", "ep_counts");
                  const int64_t ep = a.i("ep"), E = in[0].shape[1];
                  MT_CHECK_T(
                      ConfigError, E % ep == 0,
                      "expert parallel: num_experts {} must divide by expert_parallel_degree {}", E,
                      ep);
                  return std::vector<TensorMeta>{{Shape{ep, E / ep}, DType::kI32},
                                                 {Shape{2, E / ep}, DType::kI32}};
                },
            .collective = Collective::kExchange,
            .recomputable = false,
            .capacity_source = true,
            .host_published_output = 1});
  auto infer_exchange = [](const std::vector<TensorMeta>& in, const Attrs& a) {
    MT_CHECK_T(ShapeError, in.size() == 4 && in[0].shape.rank() == 2,
               "ep exchange takes rows [n, D], groups, recv_counts and local_groups");
    return std::vector<TensorMeta>{{Shape{a.i("capacity"), in[0].shape[1]}, in[0].dtype}};
  };
  r.add_op({.name = "ep_to_experts",
            .infer = infer_exchange,
            .backward =
                [](GradContext& c) {
                  EpLayout l{c.in(2), c.in(3), 0, c.attrs().i("block_rows", 0)};
                  return std::vector<ValueId>{
                      ep_from_experts(c.b, c.grad_out(0), c.in(1), l, c.b.shape(c.in(0))[0],
                                      c.attrs().group()),
                      kNoValue, kNoValue, kNoValue};
                },
            .collective = Collective::kExchange,
            .recomputable = false,
            .capacity_from_input = 2});
  r.add_op({.name = "ep_from_experts",
            .infer = infer_exchange,
            .backward =
                [](GradContext& c) {
                  EpLayout l{c.in(2), c.in(3), c.b.shape(c.in(0))[0], c.attrs().i("block_rows", 0)};
                  return std::vector<ValueId>{
                      ep_to_experts(c.b, c.grad_out(0), c.in(1), l, c.attrs().group()), kNoValue,
                      kNoValue, kNoValue};
                },
            .collective = Collective::kExchange,
            .recomputable = false});

  for (DeviceType d : {DeviceType::kCPU, DeviceType::kCUDA}) {
    r.add_kernel_factory("ep_counts", d, ServicesKernelFactory(counts_kernel));
    // Scratch: the peer-major exchange buffer (see exchange_bytes).
    r.add_kernel_factory("ep_to_experts", d,
                         ServicesKernelFactory([](const Node& n, const Graph& g, ExecServices* s) {
                           return exchange_kernel(n, g, s, true);
                         }),
                         [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                            const Attrs& a) { return exchange_bytes(in, out, a, true); });
    r.add_kernel_factory("ep_from_experts", d,
                         ServicesKernelFactory([](const Node& n, const Graph& g, ExecServices* s) {
                           return exchange_kernel(n, g, s, false);
                         }),
                         [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                            const Attrs& a) { return exchange_bytes(in, out, a, false); });
  }
}

}  // namespace meshtrain::ops
