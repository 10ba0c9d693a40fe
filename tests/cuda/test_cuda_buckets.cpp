// Bucketed collectives on the GPU: the flat-buffer packing (rank blocks) on device memory
// against the CPU packing, byte for byte, and the bucketed all_gather / reduce_scatter kernels
// (pack, one NCCL collective over the node's workspace, unpack) on a one-rank NCCL communicator,
// outputs poisoned first. Across ranks the bucketed ops run in the multi-rank GPU script
// (scripts/sched_gpu_bench.sh) and, on CPU ranks, in dist_parity_passes_* (bitwise).
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "meshtrain/comm/nccl/nccl_communicator.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cudatest {
namespace {

Tensor host_values(int64_t n, float base) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(base + 0.5f * float(i % 113) - float(i % 7));
  return Tensor::from_vector(v, Shape{n});
}

TEST(CudaBuckets, PackAndUnpackMatchTheCpu) {
  Backend& be = cuda_backend();
  std::unique_ptr<Backend> cpu = create_backend("cpu", 0);
  const int ranks = 4;
  std::vector<Tensor> host, dev;
  std::vector<size_t> block;
  for (int64_t n : {33, 1, 250, 8}) {
    host.push_back(host_values(n * ranks, float(n)));
    dev.push_back(to_device(be, host.back()));
    block.push_back(size_t(n) * sizeof(float));
  }
  const BucketLayout l = bucket_layout(block);
  const int64_t flat_n = int64_t(l.block_bytes / sizeof(float)) * ranks;
  Tensor want = Tensor::empty(Shape{flat_n}, DType::kF32);
  pack_rank_blocks(*cpu, cpu->stream(0), host, want.raw(), l, ranks);
  Tensor flat = to_device(be, host_values(flat_n, -1e6f));
  poison(flat.raw(), flat.nbytes(), be.stream(0));
  pack_rank_blocks(be, be.stream(0), dev, flat.raw(), l, ranks);
  EXPECT_EQ(to_host(be, flat).to_vector<float>(), want.to_vector<float>());
  std::vector<Tensor> back;
  for (const Tensor& h : host) {
    back.push_back(to_device(be, h));
    poison(back.back().raw(), back.back().nbytes(), be.stream(0));
  }
  unpack_rank_blocks(be, be.stream(0), flat.raw(), back, l, ranks);
  for (size_t i = 0; i < host.size(); ++i)
    EXPECT_EQ(to_host(be, back[i]).to_vector<float>(), host[i].to_vector<float>()) << i;
}

// A bucket of three tensors through the op's CUDA kernel: with one rank the gather and the
// reduce-scatter give back each input, which checks the packing into and out of the workspace.
TEST(CudaBuckets, BucketedKernelsOnOneNcclRank) {
  Backend& be = cuda_backend();
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::unique_ptr<NcclCommunicator> comm = NcclCommunicator::create(id, 1, 0, 0, "bucket", {});
  OneRankServices services(be, *comm);
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    Graph g;
    Builder b(g);
    std::vector<ValueId> xs;
    for (int64_t n : {17, 64, 5})
      xs.push_back(b.input(fmt::format("x{}", n), {Shape{n, 3}, DType::kF32}));
    b.op(op, xs, {{"group", int64_t(MeshGroup::kFsdp)}, {"group_size", int64_t(1)}});
    const Node& node = g.node(b.last_node());
    const OpRegistry& reg = OpRegistry::instance();
    KernelContext ctx;
    ctx.node = &node;
    std::vector<Tensor> host;
    for (ValueId x : xs) {
      host.push_back(host_values(g.value(x).meta.numel(), float(x)).view(g.value(x).meta.shape));
      ctx.in.push_back(to_device(be, host.back()));
      Tensor out = to_device(be, host.back());
      poison(out.raw(), out.nbytes(), be.stream(0));
      ctx.out.push_back(out);
    }
    const size_t ws = reg.workspace_bytes(node, g, DeviceType::kCUDA);
    ASSERT_GT(ws, 0u) << op;
    ctx.workspace = to_device(be, host_values(int64_t((ws + 3) / 4), 0.f))
                        .view_as(DType::kI32, Shape{int64_t((ws + 3) / 4)});
    ctx.stream = &be.stream(0);
    ctx.services = &services;
    reg.make_kernel(node, g, DeviceType::kCUDA)(ctx);
    for (size_t i = 0; i < xs.size(); ++i)
      EXPECT_EQ(to_host(be, ctx.out[i]).to_vector<float>(), host[i].to_vector<float>())
          << op << " tensor " << i;
  }
}

}  // namespace
}  // namespace meshtrain::cudatest
