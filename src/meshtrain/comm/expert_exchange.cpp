// Expert exchange ops: definitions, and one kernel per op for every backend (the communicator
// moves rows between ranks; the regrouping is contiguous device copies on the node's stream).
#include "meshtrain/comm/expert_exchange.h"

#include <numeric>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/ir/op_registry.h"
#include "meshtrain/ops/moe_permute.h"

namespace meshtrain::ops {
namespace {

void check_int_matrix(const TensorMeta& m, int64_t rows, const char* what, const char* op) {
  MT_CHECK_T(ShapeError, m.dtype == DType::kI32 && m.shape.rank() == 2 && m.shape[0] == rows,
             "{}: {} must be int32 [{}, n], found {} {}", op, what, rows, m.dtype, m.shape);
}

// Host copies of the count tensors a kernel needs, made at launch (see the header comment).
struct HostCounts {
  std::vector<int32_t> groups;  // [2, E]
  std::vector<int32_t> recv;    // [ep, El]
  std::vector<int32_t> local;   // [2, El]
};

void read_to_host(KernelContext& c, const Tensor& t, std::vector<int32_t>& out) {
  out.resize(size_t(t.numel()));
  c.services->backend().copy(out.data(), t.raw(), t.nbytes(), CopyKind::kDeviceToHost, *c.stream);
}

// Rows per peer of this rank's expert-major buffer, and per (peer, local expert) of the received.
struct Plan {
  int ep = 1, el = 0;
  std::vector<int64_t> send_rows, recv_rows;
};

Plan make_plan(const HostCounts& h, int ep) {
  Plan p;
  p.ep = ep;
  p.el = int(h.recv.size()) / ep;
  const int64_t E = int64_t(h.groups.size()) / 2;
  p.send_rows.assign(size_t(ep), 0);
  p.recv_rows.assign(size_t(ep), 0);
  for (int64_t e = 0; e < E; ++e) p.send_rows[size_t(e / p.el)] += h.groups[size_t(E + e)];
  for (int q = 0; q < ep; ++q)
    for (int e = 0; e < p.el; ++e) p.recv_rows[size_t(q)] += h.recv[size_t(q * p.el + e)];
  return p;
}

// Moves (peer, expert) blocks between the peer-major exchange buffer and the local expert-major
// buffer: to_local copies exchange -> local, else local -> exchange.
void regroup(KernelContext& c, const HostCounts& h, const Plan& p, char* exchange, char* local,
             size_t row_bytes, bool to_local) {
  Backend& be = c.services->backend();
  int64_t at = 0;  // row in the peer-major buffer
  std::vector<int64_t> next(size_t(p.el));
  for (int e = 0; e < p.el; ++e) next[size_t(e)] = h.local[size_t(e)];
  for (int q = 0; q < p.ep; ++q)
    for (int e = 0; e < p.el; ++e) {
      int64_t n = h.recv[size_t(q * p.el + e)];
      if (n == 0) continue;
      char* x = exchange + size_t(at) * row_bytes;
      char* l = local + size_t(next[size_t(e)]) * row_bytes;
      if (to_local)
        be.copy(l, x, size_t(n) * row_bytes, CopyKind::kDeviceToDevice, *c.stream);
      else
        be.copy(x, l, size_t(n) * row_bytes, CopyKind::kDeviceToDevice, *c.stream);
      at += n;
      next[size_t(e)] += n;
    }
}

size_t exchange_bytes(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                      bool to_experts) {
  const TensorMeta& local = to_experts ? out.at(0) : in.at(0);
  return local.nbytes();  // the peer-major buffer never holds more rows than the local one
}

KernelFn exchange_kernel(bool to_experts) {
  return [to_experts](KernelContext& c) {
    MT_CHECK(c.services != nullptr, "ep exchange needs the mesh's communicators");
    Communicator& comm = c.services->comm(c.attrs().group());
    Backend& be = c.services->backend();
    HostCounts h;
    read_to_host(c, c.in[1], h.groups);
    read_to_host(c, c.in[2], h.recv);
    read_to_host(c, c.in[3], h.local);
    // Host sync: NCCL/MPI need the per-peer row counts on the host (see the header).
    c.stream->synchronize();
    const Plan p = make_plan(h, comm.size());
    const Tensor& src = c.in[0];
    const Tensor& dst = c.out[0];
    const int64_t D = src.shape().numel() / std::max<int64_t>(src.shape()[0], 1);
    const size_t row_bytes = size_t(D) * dtype_size(src.dtype());
    Tensor xbuf(c.workspace.storage(), c.workspace.byte_offset(),
                Shape{c.workspace.nbytes() / int64_t(row_bytes), D}, src.dtype());
    // Padding rows and slack are zeros (moe_permute's rule); the copies then fill the data rows.
    be.fill_zero(dst.raw(), dst.nbytes(), *c.stream);
    if (to_experts) {
      comm.all_to_all_v(src, p.send_rows, xbuf, p.recv_rows, *c.stream);
      regroup(c, h, p, static_cast<char*>(xbuf.raw()), static_cast<char*>(dst.raw()), row_bytes,
              true);
    } else {
      regroup(c, h, p, static_cast<char*>(xbuf.raw()), static_cast<char*>(src.raw()), row_bytes,
              false);
      comm.all_to_all_v(xbuf, p.recv_rows, dst, p.send_rows, *c.stream);
    }
  };
}

}  // namespace

EpLayout ep_counts(Builder& b, ValueId groups, MeshGroup group, int ep, int64_t alignment,
                   int64_t choices) {
  auto outs = b.op("ep_counts", {groups},
                   {{"group", int64_t(group)}, {"ep", int64_t(ep)}, {"alignment", alignment}});
  const int64_t el = b.shape(outs[1])[1];
  return EpLayout{outs[0], outs[1], moe_capacity(int64_t(ep) * choices, el, alignment)};
}

ValueId ep_to_experts(Builder& b, ValueId x_perm, ValueId groups, const EpLayout& layout,
                      MeshGroup group) {
  return b.op1("ep_to_experts", {x_perm, groups, layout.recv_counts, layout.local_groups},
               {{"group", int64_t(group)}, {"capacity", layout.local_capacity}});
}

ValueId ep_from_experts(Builder& b, ValueId y_local, ValueId groups, const EpLayout& layout,
                        int64_t capacity, MeshGroup group) {
  return b.op1("ep_from_experts", {y_local, groups, layout.recv_counts, layout.local_groups},
               {{"group", int64_t(group)}, {"capacity", capacity}});
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
            .recomputable = false});
  auto infer_exchange = [](const std::vector<TensorMeta>& in, const Attrs& a) {
    MT_CHECK_T(ShapeError, in.size() == 4 && in[0].shape.rank() == 2,
               "ep exchange takes rows [n, D], groups, recv_counts and local_groups");
    return std::vector<TensorMeta>{{Shape{a.i("capacity"), in[0].shape[1]}, in[0].dtype}};
  };
  r.add_op({.name = "ep_to_experts",
            .infer = infer_exchange,
            .backward =
                [](GradContext& c) {
                  EpLayout l{c.in(2), c.in(3), 0};
                  return std::vector<ValueId>{
                      ep_from_experts(c.b, c.grad_out(0), c.in(1), l, c.b.shape(c.in(0))[0],
                                      c.attrs().group()),
                      kNoValue, kNoValue, kNoValue};
                },
            .collective = Collective::kExchange,
            .recomputable = false});
  r.add_op({.name = "ep_from_experts",
            .infer = infer_exchange,
            .backward =
                [](GradContext& c) {
                  EpLayout l{c.in(2), c.in(3), c.b.shape(c.in(0))[0]};
                  return std::vector<ValueId>{
                      ep_to_experts(c.b, c.grad_out(0), c.in(1), l, c.attrs().group()), kNoValue,
                      kNoValue, kNoValue};
                },
            .collective = Collective::kExchange,
            .recomputable = false});

  KernelFn counts = [](KernelContext& c) {
    MT_CHECK(c.services != nullptr, "ep_counts needs the mesh's communicators");
    Communicator& comm = c.services->comm(c.attrs().group());
    Backend& be = c.services->backend();
    const int ep = comm.size();
    const Tensor& groups = c.in[0];
    const int64_t E = groups.shape()[1], el = E / ep;
    // Row 1 of groups is [ep, El] contiguous: peer p's block is its experts' counts.
    Tensor send(groups.storage(), groups.byte_offset() + size_t(E) * 4, Shape{ep, el}, DType::kI32);
    comm.all_to_all_v(send, std::vector<int64_t>(size_t(ep), 1), c.out[0],
                      std::vector<int64_t>(size_t(ep), 1), *c.stream);
    std::vector<int32_t> recv;
    read_to_host(c, c.out[0], recv);
    // Host sync: the local groups are built on the host from the received counts.
    c.stream->synchronize();
    const int64_t align = c.attrs().i("alignment");
    std::vector<int32_t> local(size_t(2 * el));
    int64_t at = 0;
    for (int64_t e = 0; e < el; ++e) {
      int64_t n = 0;
      for (int q = 0; q < ep; ++q) n += recv[size_t(q * el + e)];
      local[size_t(e)] = int32_t(at);
      local[size_t(el + e)] = int32_t(n);
      at += (n + align - 1) / align * align;
    }
    be.copy(c.out[1].raw(), local.data(), local.size() * 4, CopyKind::kHostToDevice, *c.stream);
    // The copy reads `local` on the host: finish it before the vector goes away.
    c.stream->synchronize();
  };
  for (DeviceType d : {DeviceType::kCPU, DeviceType::kCUDA}) {
    r.add_kernel("ep_counts", d, counts);
    // Scratch: the peer-major exchange buffer (see exchange_bytes).
    r.add_kernel("ep_to_experts", d, exchange_kernel(true),
                 [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                    const Attrs&) { return exchange_bytes(in, out, true); });
    r.add_kernel("ep_from_experts", d, exchange_kernel(false),
                 [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out,
                    const Attrs&) { return exchange_bytes(in, out, false); });
  }
}

}  // namespace meshtrain::ops
