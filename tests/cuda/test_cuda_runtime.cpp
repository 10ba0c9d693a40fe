// The CUDA backend: registration and description, no device allocation after prepare(), copies
// and fills, stream priorities, cross-stream ordering with events, timing events, the profiler
// on CUDA streams, the error macros, and device-side checks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/rmsnorm.h"
#include "meshtrain/ops/swiglu.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"
#include "meshtrain/train/profiler.h"

namespace meshtrain::cudatest {
namespace {

CudaBackend& backend() { return static_cast<CudaBackend&>(cuda_backend()); }

TEST(CudaBackend, RegistersAndDescribesTheDevice) {
  ASSERT_TRUE(backend_available("cuda"));
  CudaBackend& be = backend();
  EXPECT_TRUE(be.device().is_cuda());
  EXPECT_NE(be.description().find(be.properties().name), std::string::npos) << be.description();
  EXPECT_GT(be.memory_capacity(), int64_t(1) << 30);
  const std::string name = be.properties().name;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) {
    EXPECT_GT(be.peak_flops(DType::kBF16), 7e14)
        << name << " with " << be.properties().multiProcessorCount << " SMs";
  }
}

TEST(CudaBackend, PeakFlopsTable) {
  EXPECT_EQ(cuda_peak_flops("NVIDIA H200", 9, 0, 132, DType::kBF16), 989.5e12);
  EXPECT_EQ(cuda_peak_flops("NVIDIA H100 80GB HBM3", 9, 0, 132, DType::kBF16), 989.5e12);
  EXPECT_EQ(cuda_peak_flops("NVIDIA H100 PCIe", 9, 0, 114, DType::kBF16), 756e12);
  EXPECT_EQ(cuda_peak_flops("NVIDIA H200", 9, 0, 132, DType::kF32), 0.0);
  EXPECT_EQ(cuda_peak_flops("NVIDIA A100-SXM4-80GB", 8, 0, 108, DType::kBF16), 0.0);
}

TEST(CudaBackend, CopyAndFillZeroRoundTrip) {
  CudaBackend& be = backend();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f - 3.0f;
  Tensor h = Tensor::from_vector(v, Shape{1000});
  Tensor d = to_device(be, h);
  EXPECT_EQ(to_host(be, d).to_vector<float>(), v);
  Tensor d2 = Tensor::empty(Shape{1000}, DType::kF32, be.allocator());
  be.copy(d2.raw(), d.raw(), d.nbytes(), CopyKind::kDeviceToDevice, be.stream(0));
  EXPECT_EQ(to_host(be, d2).to_vector<float>(), v);
  be.fill_zero(d2.raw(), 400 * sizeof(float), be.stream(0));
  std::vector<float> z = to_host(be, d2).to_vector<float>();
  for (size_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], i < 400 ? 0.0f : v[i]) << i;
}

TEST(CudaBackend, FreshDeviceMemoryIsZero) {
  Tensor d = Tensor::empty(Shape{4096}, DType::kF32, backend().allocator());
  for (float x : to_host(backend(), d).to_vector<float>()) ASSERT_EQ(x, 0.0f);
}

TEST(CudaBackend, CommunicationStreamsHaveHigherPriority) {
  CudaBackend& be = backend();
  be.ensure_streams(3);
  ASSERT_GE(be.num_streams(), 3);
  int p0 = 0, p1 = 0, p2 = 0;
  CUDA_CHECK(cudaStreamGetPriority(native_stream(be.stream(0)), &p0));
  CUDA_CHECK(cudaStreamGetPriority(native_stream(be.stream(1)), &p1));
  CUDA_CHECK(cudaStreamGetPriority(native_stream(be.stream(2)), &p2));
  EXPECT_LT(p1, p0) << "lower numbers are higher priorities";
  EXPECT_EQ(p1, p2);
  unsigned flags = 0;
  CUDA_CHECK(cudaStreamGetFlags(native_stream(be.stream(0)), &flags));
  EXPECT_EQ(flags & cudaStreamNonBlocking, unsigned(cudaStreamNonBlocking));
}

// Stream 1 writes A late (after a 200 ms host callback); stream 0 copies A to B after waiting on
// an event recorded behind the write. Without the wait B would hold A's old contents.
TEST(CudaBackend, EventOrdersTwoStreams) {
  CudaBackend& be = backend();
  be.ensure_streams(2);
  Stream& s0 = be.stream(0);
  Stream& s1 = be.stream(1);
  std::vector<float> ones(1 << 20, 1.0f), sevens(1 << 20, 7.0f);
  Tensor a = to_device(be, Tensor::from_vector(ones, Shape{1 << 20}));
  Tensor b = Tensor::empty(Shape{1 << 20}, DType::kF32, be.allocator());
  Tensor h7 = Tensor::empty(Shape{1 << 20}, DType::kF32, be.host_staging_allocator());
  std::copy(sevens.begin(), sevens.end(), h7.data<float>());
  const int delay_ms = 200;
  hold_stream(s1, delay_ms);
  be.copy(a.raw(), h7.raw(), a.nbytes(), CopyKind::kHostToDevice, s1);
  auto written = be.create_event(false);
  written->record(s1);
  written->wait(s0);
  be.copy(b.raw(), a.raw(), a.nbytes(), CopyKind::kDeviceToDevice, s0);
  s0.synchronize();
  std::vector<float> got = to_host(be, b).to_vector<float>();
  EXPECT_EQ(got.front(), 7.0f);
  EXPECT_EQ(got.back(), 7.0f);
}

TEST(CudaBackend, TimingEventsMeasureDeviceTime) {
  CudaBackend& be = backend();
  auto start = be.create_event(true), end = be.create_event(true);
  const int delay_ms = 50;
  start->record(be.stream(0));
  hold_stream(be.stream(0), delay_ms);
  end->record(be.stream(0));
  end->synchronize();
  const float ms = end->elapsed_ms(*start);
  EXPECT_GE(ms, 45.0f);
  EXPECT_LT(ms, 5000.0f);
}

// After prepare(), running the graph allocates nothing: no allocator call, no cudaMalloc.
TEST(CudaBackend, NoDeviceAllocationAfterPrepare) {
  CudaBackend& be = backend();
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{64, 128}, DType::kBF16});
  ValueId w = b.input("w", {Shape{128}, DType::kBF16});
  ValueId u = b.input("u", {Shape{64, 128}, DType::kBF16});
  ValueId labels = b.input("labels", {Shape{64}, DType::kI32});
  ValueId count = b.input("count", {Shape{1}, DType::kI64});
  ValueId h = ops::swiglu(b, ops::rmsnorm(b, x, w, 1e-5), u);
  ValueId loss = ops::cross_entropy(b, h, labels, count);
  g.mark_output(loss);
  Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, nullptr);
  ex.prepare();
  Tensor c = Tensor::from_vector(std::vector<int64_t>{64}, Shape{1});
  be.copy(ex.tensor(count).raw(), c.raw(), 8, CopyKind::kHostToDevice, be.stream(0));
  be.synchronize();
  const int64_t allocs = allocation_count(), mallocs = be.device_malloc_count();
  for (int i = 0; i < 3; ++i) ex.run();
  be.synchronize();
  EXPECT_EQ(allocation_count(), allocs);
  EXPECT_EQ(be.device_malloc_count(), mallocs);
  EXPECT_TRUE(std::isfinite(to_host(be, ex.tensor(loss)).item_as_double(0)));
}

// The profiler on CUDA streams: timing events around every node, one trace event per node.
TEST(CudaBackend, ProfilerTracesEveryNode) {
  CudaBackend& be = backend();
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{256, 512}, DType::kBF16});
  ValueId w = b.input("w", {Shape{512}, DType::kBF16});
  ValueId u = b.input("u", {Shape{256, 512}, DType::kBF16});
  ValueId y = ops::swiglu(b, ops::rmsnorm(b, x, w, 1e-5), u);
  g.mark_output(y);
  Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, nullptr);
  ex.prepare();
  Profiler prof(be, ex, 1, 0);
  prof.begin_step();
  ex.set_observer(&prof);
  ex.run();
  ex.set_observer(nullptr);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("mt_cuda_profiler_{}", getpid());
  const std::string file = prof.write_trace(dir.string(), 3);
  EXPECT_EQ(file, (dir / "iteration_3" / "rank0_trace.json").string());
  std::ifstream in(file);
  nlohmann::json trace = nlohmann::json::parse(in);
  int complete = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++complete;
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    if (e.at("name") == "rmsnorm") {
      EXPECT_GT(e.at("dur").get<double>(), 0.0) << e.dump();
    }
  }
  EXPECT_EQ(complete, int(ex.plan().schedule.size()));
  std::filesystem::remove_all(dir);
}

TEST(CudaCheck, ErrorsNameTheCallAndTheCudaError) {
  try {
    CUDA_CHECK(cudaSetDevice(9999));
    FAIL() << "expected a CudaError";
  } catch (const CudaError& e) {
    EXPECT_NE(e.message().find("cudaSetDevice(9999)"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("cudaErrorInvalidDevice"), std::string::npos) << e.what();
  }
  cudaGetLastError();
  try {
    CUBLAS_CHECK(7);  // CUBLAS_STATUS_INVALID_VALUE
    FAIL() << "expected a CudaError";
  } catch (const CudaError& e) {
    EXPECT_NE(e.message().find("cuBLAS status 7"), std::string::npos) << e.what();
  }
}

// A device-side check (an out-of-range token id) must surface as an error, not a wrong answer.
// A device assert poisons the CUDA context, so it runs in a child process (a gtest death test,
// re-executed so the child makes its own context) and this process's context stays intact.
TEST(CudaDeathTest, OutOfRangeEmbeddingIdFailsLoudly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        try {
          CudaBackend be(0);
          Graph g;
          Builder b(g);
          ValueId ids = b.input("ids", {Shape{4}, DType::kI32});
          ValueId w = b.input("w", {Shape{10, 8}, DType::kF32});
          g.mark_output(b.op1("embedding", {ids, w}));
          Executor ex(g, plan_memory(g, DeviceType::kCUDA), be, nullptr);
          ex.prepare();
          Tensor bad = Tensor::from_vector(std::vector<int32_t>{1, 2, 10, 3}, Shape{4});
          be.copy(ex.tensor(ids).raw(), bad.raw(), 16, CopyKind::kHostToDevice, be.stream(0));
          ex.run();
          be.synchronize();
          std::fprintf(stderr, "no error was raised\n");
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
        }
        std::_Exit(1);
      },
      "cudaErrorAssert");
}

}  // namespace
}  // namespace meshtrain::cudatest
