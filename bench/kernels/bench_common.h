// Shared by the kernel benchmarks: device buffers, a random bf16 fill, CUDA-event timing (median
// of `iters` launches after `warmup`, each launch timed by its own event pair) and the ceilings.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::bench {

// Dense bf16 tensor-core peak of an H100/H200 SXM (datasheet, boost clock).
constexpr double kPeakBf16TFlops = 989.5;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&p_, bytes)); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

void fill_random_bf16(void* p, size_t n, uint64_t seed, float scale, cudaStream_t stream);

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

inline Timing time_it(const std::function<void()>& fn, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> start(static_cast<size_t>(iters)), stop(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventCreate(&start[size_t(i)]));
    CUDA_CHECK(cudaEventCreate(&stop[size_t(i)]));
  }
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start[size_t(i)], stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop[size_t(i)], stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start[size_t(i)], stop[size_t(i)]));
    ms.push_back(t);
    cudaEventDestroy(start[size_t(i)]);
    cudaEventDestroy(stop[size_t(i)]);
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

inline double tflops(double flop, double ms) { return flop / (ms * 1e-3) / 1e12; }

// Device 0 made current, its properties in `prop`, and a non-blocking stream for the benchmark.
inline cudaStream_t open_device0(cudaDeviceProp& prop) {
  CUDA_CHECK(cudaSetDevice(0));
  prop = cudaDeviceProp{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

}  // namespace meshtrain::bench
