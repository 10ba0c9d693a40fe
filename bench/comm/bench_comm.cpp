// bench_comm: nccl-tests style size sweep of all_gather, reduce_scatter, all_reduce,
// all_to_all_v (equal splits) and broadcast through the Communicator interface only, so any
// registered backend (--backend) runs unchanged. Time = median over iterations of the slowest
// rank; busbw uses nccl-tests' factors; the last iteration is checked against exact values.
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bench/comm/bench_comm --max-bytes 16M
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/launch/bootstrap.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/tensor/tensor.h"

using namespace meshtrain;

namespace {

struct Options {
  std::string backend = "mpi";
  std::vector<std::string> ops{"all_gather", "reduce_scatter", "all_reduce", "all_to_all_v",
                               "broadcast"};
  DType dtype = DType::kF32;
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = int64_t(64) << 20;
  int iters = 20;
  int warmup = 5;
  bool check = true;
};

int64_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end ? end : "");
  int64_t mul = unit.empty() || unit == "B"    ? 1
                : unit == "K" || unit == "KiB" ? 1 << 10
                : unit == "M" || unit == "MiB" ? 1 << 20
                : unit == "G" || unit == "GiB" ? int64_t(1) << 30
                                               : -1;
  MT_CHECK_T(ConfigError, end != s.c_str() && mul > 0 && v > 0,
             "byte size expects a number with optional K/M/G suffix, found '{}'", s);
  return int64_t(v * double(mul));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      MT_CHECK_T(ConfigError, i + 1 < argc, "{} expects a value", a);
      return argv[++i];
    };
    if (a == "--backend")
      o.backend = value();
    else if (a == "--dtype")
      o.dtype = parse_dtype(value());
    else if (a == "--min-bytes")
      o.min_bytes = parse_bytes(value());
    else if (a == "--max-bytes")
      o.max_bytes = parse_bytes(value());
    else if (a == "--iters")
      o.iters = std::max(1, std::atoi(value().c_str()));
    else if (a == "--warmup")
      o.warmup = std::max(0, std::atoi(value().c_str()));
    else if (a == "--check")
      o.check = std::atoi(value().c_str()) != 0;
    else if (a == "--op") {
      o.ops.clear();
      std::string list = value();
      for (size_t p = 0; p <= list.size();) {
        size_t q = std::min(list.find(',', p), list.size());
        o.ops.push_back(list.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "bench_comm [--backend mpi] [--op all_gather,reduce_scatter,all_reduce,"
          "all_to_all_v,broadcast] [--dtype float32|float64|bfloat16|int32|int64] "
          "[--min-bytes 1K] [--max-bytes 64M] [--iters 20] [--warmup 5] [--check 1]\n");
      std::exit(0);
    } else {
      MT_THROW(ConfigError, "unknown option '{}' (see --help)", a);
    }
  }
  for (const auto& op : o.ops)
    MT_CHECK_T(ConfigError,
               op == "all_gather" || op == "reduce_scatter" || op == "all_reduce" ||
                   op == "all_to_all_v" || op == "broadcast",
               "--op: unknown collective '{}'", op);
  return o;
}

// Small integers: sums over any rank count used here are exact in every dtype, bf16 included.
double pattern(int r, int64_t i) { return double((r * 7 + i * 3) % 17); }

void set_elem(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: static_cast<float*>(t.raw())[i] = float(v); break;
    case DType::kF64: static_cast<double*>(t.raw())[i] = v; break;
    case DType::kBF16: static_cast<BFloat16*>(t.raw())[i] = BFloat16(float(v)); break;
    case DType::kI32: static_cast<int32_t*>(t.raw())[i] = int32_t(v); break;
    case DType::kI64: static_cast<int64_t*>(t.raw())[i] = int64_t(v); break;
  }
}

struct Bench {
  Communicator& comm;
  Backend& backend;
  Stream& stream;
  const Options& opt;

  Tensor device(int64_t n) { return Tensor::empty(Shape{n}, opt.dtype, backend.allocator()); }
  Tensor host(int64_t n) {
    return Tensor::empty(Shape{n}, opt.dtype, backend.host_staging_allocator());
  }
  void upload(const Tensor& dst, const Tensor& src) {
    backend.copy(dst.raw(), src.raw(), src.nbytes(), CopyKind::kHostToDevice, stream);
  }
  Tensor download(const Tensor& src) {
    Tensor h = host(src.numel());
    backend.copy(h.raw(), src.raw(), src.nbytes(), CopyKind::kDeviceToHost, stream);
    stream.synchronize();  // the check reads the host copy
    return h;
  }

  // Median over iterations of the slowest rank's time, in microseconds.
  double median_max_us(std::vector<double>& local_us) {
    Tensor t =
        Tensor::wrap(local_us.data(), Shape{int64_t(local_us.size())}, DType::kF64, Device{});
    Tensor d = Tensor::empty(t.shape(), DType::kF64, backend.allocator());
    backend.copy(d.raw(), t.raw(), t.nbytes(), CopyKind::kHostToDevice, stream);
    comm.all_reduce(d, ReduceOp::kMax, stream).wait();
    backend.copy(t.raw(), d.raw(), t.nbytes(), CopyKind::kDeviceToHost, stream);
    stream.synchronize();
    std::sort(local_us.begin(), local_us.end());
    return local_us[local_us.size() / 2];
  }

  // Runs `op` warmup + iters times; `reset` restores inputs outside the timed region.
  template <typename Op, typename Reset>
  double time_us(Op op, Reset reset) {
    auto start = backend.create_event(true);
    auto stop = backend.create_event(true);
    std::vector<double> us;
    for (int it = 0; it < opt.warmup + opt.iters; ++it) {
      reset();
      stream.synchronize();
      comm.barrier();  // every rank enters the collective together
      start->record(stream);
      Work w = op();
      w.wait();
      stop->record(stream);
      stop->synchronize();
      if (it >= opt.warmup) us.push_back(double(stop->elapsed_ms(*start)) * 1e3);
    }
    return median_max_us(us);
  }

  int64_t count_wrong(const Tensor& out_dev, const std::function<double(int64_t)>& want) {
    Tensor h = download(out_dev);
    int64_t wrong = 0;
    for (int64_t i = 0; i < h.numel(); ++i) wrong += h.item_as_double(i) != want(i);
    Tensor t = Tensor::from_vector<int64_t>({wrong}, Shape{1});
    Tensor d = Tensor::empty(Shape{1}, DType::kI64, backend.allocator());
    backend.copy(d.raw(), t.raw(), 8, CopyKind::kHostToDevice, stream);
    comm.all_reduce(d, ReduceOp::kSum, stream).wait();
    backend.copy(t.raw(), d.raw(), 8, CopyKind::kDeviceToHost, stream);
    stream.synchronize();
    return t.data<int64_t>()[0];
  }

  double sum_over_ranks(int64_t i) {
    double s = 0;
    for (int p = 0; p < comm.size(); ++p) s += pattern(p, i);
    return s;
  }

  // Returns the number of wrong elements over all ranks (0 when unchecked or skipped).
  int64_t run(const std::string& name, int64_t bytes) {
    const int n = comm.size(), me = comm.rank();
    const int64_t esz = int64_t(dtype_size(opt.dtype));
    const bool per_rank = name != "all_reduce" && name != "broadcast";
    // nccl-tests sizes: the whole buffer (gathered output, scattered input, a2a send buffer).
    const int64_t block = per_rank ? bytes / (esz * n) : bytes / esz;
    if (block == 0) return 0;
    const int64_t count = per_rank ? block * n : block;
    Tensor pristine = host(count);
    for (int64_t i = 0; i < count; ++i) set_elem(pristine, i, pattern(me, i));
    double factor = 1.0;
    double us = 0;
    int64_t wrong = 0;
    if (name == "all_gather") {
      factor = double(n - 1) / n;
      Tensor in = device(block), out = device(count);
      upload(in, pristine.slice_rows(0, block));
      us = time_us([&] { return comm.all_gather(in, out, stream); }, [] {});
      if (opt.check)
        wrong = count_wrong(out, [&](int64_t k) { return pattern(int(k / block), k % block); });
    } else if (name == "reduce_scatter") {
      factor = double(n - 1) / n;
      Tensor in = device(count), out = device(block);
      upload(in, pristine);
      us = time_us([&] { return comm.reduce_scatter(in, out, ReduceOp::kSum, stream); }, [] {});
      if (opt.check)
        wrong = count_wrong(out, [&](int64_t j) { return sum_over_ranks(me * block + j); });
    } else if (name == "all_reduce") {
      factor = 2.0 * double(n - 1) / n;
      Tensor buf = device(count);
      us = time_us([&] { return comm.all_reduce(buf, ReduceOp::kSum, stream); },
                   [&] { upload(buf, pristine); });
      if (opt.check) wrong = count_wrong(buf, [&](int64_t i) { return sum_over_ranks(i); });
    } else if (name == "all_to_all_v") {
      factor = double(n - 1) / n;
      Tensor in = device(count), out = device(count);
      upload(in, pristine);
      std::vector<int64_t> rows(size_t(n), block);
      us = time_us([&] { return comm.all_to_all_v(in, rows, out, rows, stream); }, [] {});
      if (opt.check)
        wrong = count_wrong(
            out, [&](int64_t k) { return pattern(int(k / block), me * block + k % block); });
    } else if (name == "broadcast") {
      Tensor buf = device(count);
      us = time_us([&] { return comm.broadcast(buf, 0, stream); }, [&] { upload(buf, pristine); });
      if (opt.check) wrong = count_wrong(buf, [&](int64_t i) { return pattern(0, i); });
    }
    const double size_b = double(count * esz);
    const double algbw = size_b / (us * 1e-6) / 1e9;
    if (me == 0)
      std::printf(
          "%15s %12lld %12lld %9s %6s %11.2f %12.3f %12.3f %7s\n", name.c_str(),
          (long long)(count * esz), (long long)count, dtype_name(opt.dtype),
          name == "all_gather" || name == "all_to_all_v" || name == "broadcast" ? "-" : "sum", us,
          algbw, algbw * factor, opt.check ? std::to_string(wrong).c_str() : "n/a");
    return wrong;
  }

  // Ceiling: one rank's device copy bandwidth at the largest size (shared memory moves data
  // through the same memory system; busbw above it would mean a measurement error).
  double copy_gbps() {
    int64_t n = opt.max_bytes / int64_t(dtype_size(opt.dtype));
    Tensor a = device(n), b = device(n);
    auto start = backend.create_event(true), stop = backend.create_event(true);
    std::vector<double> us;
    for (int it = 0; it < 3 + opt.iters; ++it) {
      start->record(stream);
      backend.copy(b.raw(), a.raw(), a.nbytes(), CopyKind::kDeviceToDevice, stream);
      stop->record(stream);
      stop->synchronize();
      if (it >= 3) us.push_back(double(stop->elapsed_ms(*start)) * 1e3);
    }
    std::sort(us.begin(), us.end());
    return double(a.nbytes()) / (us[us.size() / 2] * 1e-6) / 1e9;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int world_size = 1;
  try {
    Options opt = parse(argc, argv);
    Runtime rt(&argc, &argv);
    world_size = rt.world_size();
    Communicator& comm = rt.world(opt.backend);
    Device dev = comm.device();
    auto backend = create_backend(dev.is_cpu() ? "cpu" : "cuda", dev.index);
    Bench b{comm, *backend, backend->stream(0), opt};
    double ceiling = b.copy_gbps();
    if (comm.rank() == 0) {
      std::printf(
          "# bench_comm: backend %s, %d ranks, device %s, dtype %s, %d iters after %d "
          "warm-up, time = median of slowest rank\n",
          opt.backend.c_str(), comm.size(), backend->description().c_str(), dtype_name(opt.dtype),
          opt.iters, opt.warmup);
      std::printf("# ceiling: single-rank device copy %.2f GB/s at %lld bytes\n", ceiling,
                  (long long)opt.max_bytes);
      std::printf("#%14s %12s %12s %9s %6s %11s %12s %12s %7s\n", "op", "size(B)", "count", "type",
                  "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    int64_t total_wrong = 0;
    for (const auto& op : opt.ops)
      for (int64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 2)
        total_wrong += b.run(op, bytes);
    if (total_wrong > 0 && comm.rank() == 0)
      std::fprintf(stderr, "bench_comm: %lld wrong elements\n", (long long)total_wrong);
    return total_wrong > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    if (world_size > 1) abort_all(1);
    return 1;
  }
}
