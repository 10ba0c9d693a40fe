// bench_grouped_gemm: the grouped GEMMs of the routed experts on DeepSeek 16B's expert shapes (64
// experts, 2048 -> 1408, bf16), with the groups made by moe_dispatch_plan as in the model, three
// ways in one run: the ops' cuBLASLt path (per-expert cuBLASLt over four streams, `kernel` =
// cublas, the host reading the plan's published groups), `kernel` = meshtrain (meshtrain's
// grouped GEMM, moe/cuda/grouped_gemm_sm90.h, plus the op's zeroing of the rows
// outside the groups) and every tile variant of that kernel called directly. FLOP = Σ_e
// 2·rows_e·k·n. Time = median of --iters launches after --warmup, CUDA events. Each output is
// checked against classic cuBLAS run per expert on the same operands (relative L2 error, worst
// expert). bench/kernels/grouped_mm_torch.py times torch._grouped_mm on the same distributions.
//
//   build/bench/kernels/bench_grouped_gemm [--iters 50] [--warmup 5] [--tsv FILE] [--counts]
//                                          [--variants 0,1,...]  (the Hopper variants timed)
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_op_kernels.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/moe/cuda/grouped_gemm_sm90.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"

using namespace meshtrain;
using namespace meshtrain::bench;

namespace {

constexpr int64_t kExperts = 64, kDim = 2048, kHidden = 1408, kTopK = 6;
constexpr int64_t kAlignment = 8;  // DeepSeekV3's token_group_alignment (model/deepseek_v3.h)
constexpr double kMaxRelErr = 1e-2;

struct Options {
  int iters = 50, warmup = 5;
  std::string tsv;
  bool counts_only = false;
  std::vector<int> variants;  // the Hopper variants to time directly (empty: all)
};

struct Distribution {
  std::string name;
  std::vector<int64_t> counts;  // rows per expert, multiples of 16, summing to a multiple of k
};

// Rows per expert. The skewed one (also in grouped_mm_torch.py, same formula): 98,304 rows (the
// e2e batch, 4 × 4096 tokens × top-6) with weights exp(-e/20), rounded to multiples of 16, the
// remainder on expert 0: max/mean ≈ 3.3, min ≈ 0.14 × mean.
std::vector<Distribution> distributions() {
  // 768: where expert_gemm_backend "auto" switches from the Hopper kernel to cuBLASLt.
  std::vector<Distribution> d{{"uniform 384", std::vector<int64_t>(kExperts, 384)},
                              {"uniform 768", std::vector<int64_t>(kExperts, 768)},
                              {"uniform 1536", std::vector<int64_t>(kExperts, 1536)}};
  const int64_t total = 1536 * kExperts;
  double wsum = 0;
  for (int64_t e = 0; e < kExperts; ++e) wsum += std::exp(-double(e) / 20.0);
  std::vector<int64_t> c(kExperts);
  int64_t sum = 0;
  for (int64_t e = 1; e < kExperts; ++e) {
    c[size_t(e)] =
        16 * int64_t(std::floor(double(total / 16) * std::exp(-double(e) / 20.0) / wsum + 0.5));
    sum += c[size_t(e)];
  }
  c[0] = total - sum;
  d.push_back({"skewed exp(-e/20)", c});
  return d;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_grouped_gemm: %s expects a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--iters")
      o.iters = std::max(1, std::atoi(value().c_str()));
    else if (a == "--warmup")
      o.warmup = std::max(0, std::atoi(value().c_str()));
    else if (a == "--tsv")
      o.tsv = value();
    else if (a == "--counts")
      o.counts_only = true;
    else if (a == "--variants") {  // comma-separated numbers (GroupedSm90Variant)
      const std::string list = value();
      for (size_t at = 0; at < list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        o.variants.push_back(std::atoi(list.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_grouped_gemm [--iters N] [--warmup N] [--tsv FILE] [--counts] "
                   "[--variants 0,1,...]\n");
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

// One graph per distribution: ids -> moe_dispatch_plan -> the three expert products, built by op
// name so the kernels are the registry's (the same factories the executor calls).
struct GroupedGraph {
  Graph g;
  ValueId ids, row_map, groups, x, w, dy;
  ValueId y[2], dx[2], dw[2];
  NodeId plan;
  NodeId fwd[2], dgrad[2], wgrad[2];  // [0]: kernel cublas, [1]: kernel meshtrain
};
constexpr const char* kOpPaths[2] = {"op, cuBLASLt per expert", "op, meshtrain (sm90)"};

void build(GroupedGraph& gg, int64_t choices) {
  Builder b(gg.g);
  gg.ids = b.input("ids", {Shape{choices / kTopK, kTopK}, DType::kI32});
  std::vector<ValueId> p =
      b.op("moe_dispatch_plan", {gg.ids}, {{"num_experts", kExperts}, {"alignment", kAlignment}});
  gg.plan = b.last_node();
  gg.row_map = p[0];
  gg.groups = p[1];
  const int64_t capacity = (choices + kExperts * (kAlignment - 1) + kAlignment - 1) / kAlignment *
                           kAlignment;  // ops::moe_capacity
  gg.x = b.input("x", {Shape{capacity, kDim}, DType::kBF16});
  gg.w = b.input("w1", {Shape{kExperts, kHidden, kDim}, DType::kBF16});
  gg.dy = b.input("dy", {Shape{capacity, kHidden}, DType::kBF16});
  // One set of nodes per path, each with its own outputs.
  for (int path = 0; path < 2; ++path) {
    const int64_t kernel =
        int64_t(path == 0 ? ops::ExpertGemmKernel::kCublas : ops::ExpertGemmKernel::kMeshtrain);
    gg.y[path] = b.op1("grouped_matmul", {gg.x, gg.w, gg.groups},
                       {{"transpose_w", int64_t(1)}, {"kernel", kernel}});
    gg.fwd[path] = b.last_node();
    gg.dx[path] = b.op1("grouped_matmul", {gg.dy, gg.w, gg.groups},
                        {{"transpose_w", int64_t(0)}, {"kernel", kernel}});
    gg.dgrad[path] = b.last_node();
    gg.dw[path] = b.op1("grouped_matmul_wgrad", {gg.dy, gg.x, gg.groups}, {{"kernel", kernel}});
    gg.wgrad[path] = b.last_node();
  }
}

// One column-major product per expert, as the op's launches map it (grouped_matmul.cu):
// C[m, n] = op(A) op(B), A/B/C advanced per expert by a_step/b_step/c_step elements (or by the
// expert's first row times row_a/row_b/row_c).
struct Product {
  std::string name;
  int form;            // 0 forward, 1 dgrad, 2 wgrad (the direct kernel call)
  const NodeId* node;  // [2]: per op path
  ValueId a, b;        // cuBLAS A, B
  const ValueId* c;    // [2]: cuBLAS C, the op path's output
  bool ta, tb;
  int64_t m, lda, ldb, ldc;
  bool rows_in_k;  // wgrad: the expert's rows are the k extent
  int64_t a_expert, a_row, b_expert, b_row, c_expert, c_row;  // element offsets per expert / row
};

std::vector<Product> products(const GroupedGraph& gg) {
  return {
      // y_e [rows, 1408] = x_e · w_eᵀ: C = w_eᵀ(A, T, lda 2048) · x_eᵀ(B, ldb 2048), ldc 1408.
      {"fwd x·W1ᵀ (2048->1408)", 0, gg.fwd, gg.w, gg.x, gg.y, true, false, kHidden, kDim, kDim,
       kHidden, false, kHidden * kDim, 0, 0, kDim, 0, kHidden},
      // dx_e [rows, 2048] = dy_e · w_e: C = w_e(A, N, lda 2048) · dy_eᵀ(B, ldb 1408), ldc 2048.
      {"dgrad dy·W1 (1408->2048)", 1, gg.dgrad, gg.w, gg.dy, gg.dx, false, false, kDim, kDim,
       kHidden, kDim, false, kHidden * kDim, 0, 0, kHidden, 0, kDim},
      // dw_e [1408, 2048] = dy_eᵀ x_e: C[2048, 1408] = x_eᵀ(A, N, lda 2048) · dy_e(B, T, 1408).
      {"wgrad dyᵀ·x (Σ rows)", 2, gg.wgrad, gg.x, gg.dy, gg.dw, false, true, kDim, kDim, kHidden,
       kDim, true, 0, kDim, 0, kHidden, kHidden * kDim, 0},
  };
}

std::vector<uint16_t> to_host(const void* p, size_t elems) {
  std::vector<uint16_t> h(elems);
  CUDA_CHECK(cudaMemcpy(h.data(), p, elems * 2, cudaMemcpyDeviceToHost));
  return h;
}

// Worst per-expert relative L2 difference between the op's output and classic cuBLAS.
double check_against_cublas(const Product& pr, ValueId out, const GraphKernels& k,
                            const Distribution& d, const std::vector<int64_t>& starts,
                            cublasHandle_t blas, size_t c_elems) {
  DeviceBuffer ref(c_elems * 2);
  CUDA_CHECK(cudaMemset(ref.get(), 0, ref.bytes()));
  const float one = 1.f, zero = 0.f;
  auto at = [](const void* base, int64_t elems) {
    return static_cast<const char*>(base) + size_t(elems) * 2;
  };
  for (int64_t e = 0; e < kExperts; ++e) {
    const int64_t rows = d.counts[size_t(e)], s = starts[size_t(e)];
    const int64_t n = pr.rows_in_k ? kHidden : rows,
                  kk = pr.rows_in_k ? rows : (pr.ta ? kDim : kHidden);
    CUBLAS_CHECK(cublasGemmEx(
        blas, pr.ta ? CUBLAS_OP_T : CUBLAS_OP_N, pr.tb ? CUBLAS_OP_T : CUBLAS_OP_N, int(pr.m),
        int(n), int(kk), &one, at(k.ptr(pr.a), e * pr.a_expert + s * pr.a_row), CUDA_R_16BF,
        int(pr.lda), at(k.ptr(pr.b), e * pr.b_expert + s * pr.b_row), CUDA_R_16BF, int(pr.ldb),
        &zero, const_cast<char*>(at(ref.get(), e * pr.c_expert + s * pr.c_row)), CUDA_R_16BF,
        int(pr.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = to_host(k.ptr(out), c_elems),
                              want = to_host(ref.get(), c_elems);
  double worst = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const int64_t rows = d.counts[size_t(e)], s = starts[size_t(e)];
    const size_t from = size_t(e * pr.c_expert + s * pr.c_row);
    const size_t len = size_t(pr.rows_in_k ? kHidden * kDim : rows * pr.m);
    double d2 = 0, r2 = 0;
    for (size_t i = from; i < from + len; ++i) {
      const double u = BFloat16::to_float(got[i]), v = BFloat16::to_float(want[i]);
      d2 += (u - v) * (u - v);
      r2 += v * v;
    }
    const double rel = std::isfinite(d2) ? std::sqrt(d2 / std::max(r2, 1e-300)) : INFINITY;
    worst = std::max(worst, rel);
  }
  return worst;
}

struct Row {
  std::string dist, product, path;
  double flop, queued_ms, waited_ms, host_ms, rel_err;  // waited/host: < 0 where not measured
};

// The kernel of grouped_gemm_sm90.h called directly for product `pr` (its output: the meshtrain
// path's value).
bool direct_sm90(const Product& pr, const GroupedGraph& gg, GraphKernels& k, int variant,
                 cudaStream_t s) {
  const auto* groups = static_cast<const int32_t*>(k.ptr(gg.groups));
  const int64_t rows = gg.g.value(gg.x).meta.shape[0];
  if (pr.form == 2)
    return cuda::grouped_wgrad_sm90({k.ptr(gg.dy), k.ptr(gg.x), k.ptr(pr.c[1]), groups, kExperts,
                                     rows, kHidden, kDim, false, false},
                                    s, variant);
  const bool fwd = pr.form == 0;
  return cuda::grouped_gemm_sm90({k.ptr(fwd ? gg.x : gg.dy), k.ptr(gg.w), k.ptr(pr.c[1]), groups,
                                  kExperts, rows, fwd ? kHidden : kDim, fwd ? kDim : kHidden, fwd},
                                 s, variant);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const std::vector<Distribution> dists = distributions();
  for (const Distribution& d : dists) {
    int64_t sum = 0, mx = 0, mn = INT64_MAX;
    for (int64_t c : d.counts) sum += c, mx = std::max(mx, c), mn = std::min(mn, c);
    std::printf("rows per expert, %s: total %lld, min %lld, max %lld (max/mean %.2f)%s",
                d.name.c_str(), (long long)sum, (long long)mn, (long long)mx,
                double(mx) * kExperts / double(sum), o.counts_only ? ":" : "\n");
    if (o.counts_only) {
      for (int64_t c : d.counts) std::printf(" %lld", (long long)c);
      std::printf("\n");
    }
  }
  if (o.counts_only) return 0;

  CudaBackend backend(0);
  Stream& stream = backend.stream(0);
  cudaStream_t s = native_stream(stream);
  const cudaDeviceProp& prop = backend.properties();
  std::printf(
      "bench_grouped_gemm: %s, %d SMs; %lld experts, d_model %lld, expert hidden %lld, bf16 in / "
      "fp32 accumulate / bf16 out; FLOP = sum over experts of 2*rows*k*n; median of %d after %d "
      "warm-up (CUDA events)\n",
      prop.name, prop.multiProcessorCount, (long long)kExperts, (long long)kDim, (long long)kHidden,
      o.iters, o.warmup);
  cublasHandle_t blas;
  CUBLAS_CHECK(cublasCreate(&blas));
  DeviceBuffer blas_ws(32u << 20);
  CUBLAS_CHECK(cublasSetWorkspace(blas, blas_ws.get(), blas_ws.bytes()));

  std::vector<Row> rows;
  for (const Distribution& d : dists) {
    int64_t choices = 0;
    for (int64_t c : d.counts) choices += c;
    GroupedGraph gg;
    build(gg, choices);
    GraphKernels k(gg.g, stream);
    // ids: expert e repeated counts[e] times (a token's k choices need not differ for the plan).
    std::vector<int32_t> ids;
    for (int64_t e = 0; e < kExperts; ++e)
      ids.insert(ids.end(), size_t(d.counts[size_t(e)]), int32_t(e));
    CUDA_CHECK(cudaMemcpy(k.ptr(gg.ids), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    const TensorMeta& xm = gg.g.value(gg.x).meta;
    fill_random_bf16(k.ptr(gg.x), size_t(xm.numel()), 1, 1.f, s);
    fill_random_bf16(k.ptr(gg.w), size_t(kExperts * kHidden * kDim), 2, 1.f, s);
    fill_random_bf16(k.ptr(gg.dy), size_t(gg.g.value(gg.dy).meta.numel()), 3, 1.f, s);
    k.run(gg.plan);  // publishes the groups on the host, as in a step
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<int32_t> groups(size_t(2 * kExperts));
    CUDA_CHECK(
        cudaMemcpy(groups.data(), k.ptr(gg.groups), groups.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<int64_t> starts(static_cast<size_t>(kExperts));
    for (int64_t e = 0; e < kExperts; ++e) {
      starts[size_t(e)] = groups[size_t(e)];
      MT_CHECK(groups[size_t(kExperts + e)] == d.counts[size_t(e)],
               "bench_grouped_gemm: the dispatch plan gave expert {} {} rows, expected {}", e,
               groups[size_t(kExperts + e)], d.counts[size_t(e)]);
    }
    const double flop = 2.0 * double(choices) * double(kDim) * double(kHidden);
    const size_t out_elems[3] = {size_t(gg.g.value(gg.y[0]).meta.numel()),
                                 size_t(gg.g.value(gg.dx[0]).meta.numel()),
                                 size_t(gg.g.value(gg.dw[0]).meta.numel())};
    for (const Product& pr : products(gg))
      for (int path = 0; path < 2; ++path) {
        Row r{d.name, pr.name, kOpPaths[path], flop, 0, 0, 0, 0};
        const NodeId node = pr.node[path];
        // Queued: the host launches ahead of the GPU (the backward's case: the plan's event is
        // long done, so the op reads the published groups without waiting).
        r.queued_ms = time_it([&] { k.run(node); }, s, o.warmup, o.iters).median_ms;
        // After a host wait: the stream drains before each launch, as the forward's expert GEMMs
        // wait for their dispatch plan; the GPU idles while the host launches the first experts.
        std::vector<double> host;
        r.waited_ms = time_it(
                          [&] {
                            CUDA_CHECK(cudaStreamSynchronize(s));
                            const auto t0 = std::chrono::steady_clock::now();
                            k.run(node);
                            host.push_back(std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - t0)
                                               .count());
                          },
                          s, o.warmup, o.iters)
                          .median_ms;
        std::sort(host.begin(), host.end());
        r.host_ms = host[host.size() / 2];
        CUDA_CHECK(cudaStreamSynchronize(s));
        r.rel_err = check_against_cublas(pr, pr.c[path], k, d, starts, blas, out_elems[pr.form]);
        rows.push_back(r);
      }
    // Every tile variant of the Hopper kernel, called directly (no op around it).
    for (const Product& pr : products(gg))
      for (int v = 0; v < cuda::grouped_gemm_sm90_num_variants(); ++v) {
        if (!o.variants.empty() &&
            std::find(o.variants.begin(), o.variants.end(), v) == o.variants.end())
          continue;
        Row r{d.name, pr.name, std::string("sm90 ") + cuda::grouped_gemm_sm90_variant_name(v),
              flop,   0,       -1,
              -1,     0};
        CUDA_CHECK(cudaMemsetAsync(k.ptr(pr.c[1]), 0xFF, out_elems[pr.form] * 2, s));
        if (!direct_sm90(pr, gg, k, v, s)) {
          std::printf("%s: %s refused the shape (no Hopper GPU?)\n", r.path.c_str(),
                      pr.name.c_str());
          continue;
        }
        CUDA_CHECK(cudaStreamSynchronize(s));
        r.rel_err = check_against_cublas(pr, pr.c[1], k, d, starts, blas, out_elems[pr.form]);
        r.queued_ms =
            time_it([&] { direct_sm90(pr, gg, k, v, s); }, s, o.warmup, o.iters).median_ms;
        rows.push_back(r);
      }
  }

  std::printf(
      "\ntargets (issue 26, device-offset grouped GEMMs): >= 520 TFLOP/s at 384 rows per expert, "
      ">= 620 at 1536; rel err = worst expert's relative L2 difference from cublasGemmEx\n");
  std::printf("%-18s %-26s %-30s | %9s %8s | %9s %8s %8s | %8s\n", "rows per expert", "product",
              "path", "queued ms", "TFLOP/s", "waited ms", "TFLOP/s", "host ms", "rel err");
  bool ok = true;
  for (const Row& r : rows) {
    std::printf("%-18s %-26s %-30s | %9.3f %8.1f | ", r.dist.c_str(), r.product.c_str(),
                r.path.c_str(), r.queued_ms, tflops(r.flop, r.queued_ms));
    if (r.waited_ms >= 0)
      std::printf("%9.3f %8.1f %8.3f", r.waited_ms, tflops(r.flop, r.waited_ms), r.host_ms);
    else
      std::printf("%9s %8s %8s", "-", "-", "-");
    std::printf(" | %8.1e%s\n", r.rel_err, r.rel_err <= kMaxRelErr ? "" : "  FAIL");
    ok = ok && r.rel_err <= kMaxRelErr;
  }
  std::printf(
      "queued: launches back to back (host ahead of the GPU); waited: the stream drained before "
      "each launch (the forward's wait for its dispatch plan); host ms: the launch's host time "
      "(cuBLASLt: 64 calls over 4 streams; meshtrain: one zeroing kernel and one grouped "
      "GEMM); sm90 rows: the kernel alone, launches back to back\n");
  if (!o.tsv.empty()) {
    std::ofstream f(o.tsv);
    f.precision(17);
    f << "dist\tproduct\tpath\tflop\tqueued_ms\twaited_ms\thost_ms\trel_err\n";
    for (const Row& r : rows)
      f << r.dist << '\t' << r.product << '\t' << r.path << '\t' << r.flop << '\t' << r.queued_ms
        << '\t' << r.waited_ms << '\t' << r.host_ms << '\t' << r.rel_err << '\n';
    MT_CHECK(f.good(), "bench_grouped_gemm: cannot write {}", o.tsv);
  }
  cublasDestroy(blas);
  if (!ok) {
    std::fprintf(stderr, "bench_grouped_gemm: an output differs from cuBLAS by more than %.0e\n",
                 kMaxRelErr);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_grouped_gemm: %s\n", e.what());
  return 1;
}
