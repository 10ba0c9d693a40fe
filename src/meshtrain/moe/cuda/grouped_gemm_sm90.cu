// Host side of meshtrain's Hopper grouped GEMM (grouped_gemm_sm90.h): the tile variants, their
// launches (persistent grids, 2-CTA clusters through cudaLaunchKernelEx), the TMA maps, and the
// checks that decide whether a call can run here. The kernel is grouped_gemm_sm90_kernel.cuh.
#include <algorithm>
#include <atomic>

#include "meshtrain/core/check.h"
#include "meshtrain/moe/cuda/grouped_gemm_sm90.h"
#include "meshtrain/moe/cuda/grouped_gemm_sm90_kernel.cuh"
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace gg90 {

using namespace hopper;

bool device_is_sm90_with_sms(int* sms) {
  static std::atomic<int> cached[64] = {};  // 0 unknown, else SM count + 1 (1: not sm90)
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  int v = device < 64 ? cached[device].load() : 0;
  if (v == 0) {
    int major = 0, minor = 0, count = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    v = major == 9 && minor == 0 ? count + 1 : 1;
    if (device < 64) cached[device].store(v);
  }
  *sms = v - 1;
  return v > 1;
}

// A row-major bf16 matrix [rows, cols] (or `batch` of them) as a TMA map with a box of 64 columns
// by `box_rows` rows.
void encode(CUtensorMap* map, const void* ptr, int64_t cols, int64_t rows, int64_t batch,
            uint32_t box_rows, const char* what) {
  const uint64_t dims[3] = {uint64_t(cols), uint64_t(rows), uint64_t(batch)};
  const uint64_t strides[2] = {uint64_t(cols * 2), uint64_t(rows * cols * 2)};
  const uint32_t box[3] = {64, box_rows, 1};
  const CUresult rc = encode_tensor_map_bf16(map, ptr, batch > 1 ? 3 : 2, dims, strides, box);
  MT_CHECK(rc == CUDA_SUCCESS,
           "grouped GEMM sm90: cuTensorMapEncodeTiled failed with CUresult {} for {} [{}, {}, {}] "
           "at {} (box rows {}); the driver may be older than CUDA 12",
           int(rc), what, batch, rows, cols, ptr, box_rows);
}

// A launch of `grid` CTAs of kThreads in clusters of `cl` along x (cfg points at attr: no copies).
struct ClusterLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  ClusterLaunch(unsigned grid, int cl, size_t smem, cudaStream_t stream) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(cl);
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many clusters of `cl` CTAs of this kernel fit on the device at once (0: none, or unknown).
template <auto kernel>
int max_active_clusters(int cl, size_t smem, int sms) {
  static std::atomic<int> cached[64] = {};  // by device: 0 unknown, else count + 1
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int known = device < 64 ? cached[device].load() : 0;
  if (known > 0) return known - 1;
  const ClusterLaunch query(unsigned(sms - sms % cl), cl, smem, nullptr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &query.cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  if (device < 64) cached[device].store(n + 1);
  return n;
}

template <Form F, int BM, int BN, int STAGES, bool PING = false, int CL = 1, bool TS = false>
void launch(const Params& p, int64_t max_tiles, int sms, cudaStream_t stream) {
  // The weight gradient keeps its register epilogue (fp32, += : no bf16 staging).
  constexpr bool kTs = TS && F != Form::kWgrad;
  using Cf = Cfg<BM, BN, STAGES, kTs>;
  constexpr auto kernel = grouped_gemm_kernel<F, BM, BN, STAGES, PING, CL, kTs>;
  attn::set_smem_limit_once<kernel>(Cf::kSmem);
  if constexpr (CL == 1) {
    const unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(sms, max_tiles)));
    kernel<<<grid, kThreads, Cf::kSmem, stream>>>(p);
  } else {
    const int fit = max_active_clusters<kernel>(CL, Cf::kSmem, sms);
    MT_CHECK(fit > 0,
             "grouped GEMM sm90: no cluster of {} CTAs with {} bytes of shared memory fits "
             "this device",
             CL, Cf::kSmem);
    const int64_t units = (max_tiles + CL - 1) / CL;
    const ClusterLaunch run(unsigned(CL * std::max<int64_t>(1, std::min<int64_t>(fit, units))), CL,
                            Cf::kSmem, stream);
    CUDA_CHECK(cudaLaunchKernelEx(&run.cfg, kernel, p));
  }
  CUDA_CHECK_LAUNCH("grouped_gemm_sm90");
}

struct Variant {
  const char* name;
  int bm, bn, cl;  // tile rows and columns; CTAs per cluster
  bool tma_store;  // the forward's and dgrad's whole halves leave by TMA store (tm_y)
  void (*fwd)(const Params&, int64_t, int, cudaStream_t);
  void (*dgrad)(const Params&, int64_t, int, cudaStream_t);
  void (*wgrad)(const Params&, int64_t, int, cudaStream_t);
};
// In the order of GroupedSm90Variant (grouped_gemm_sm90.h), which says what each is chosen for.
template <int BM, int BN, int STAGES, bool PING = false, int CL = 1, bool TS = false>
constexpr Variant variant(const char* name) {
  return {name,
          BM,
          BN,
          CL,
          TS,
          &launch<Form::kForward, BM, BN, STAGES, PING, CL, TS>,
          &launch<Form::kDgrad, BM, BN, STAGES, PING, CL, TS>,
          &launch<Form::kWgrad, BM, BN, STAGES, PING, CL, TS>};
}
constexpr Variant kVariants[] = {
    variant<128, 256, 4>("128x256 tiles, 4 stages"),
    variant<128, 128, 6>("128x128 tiles, 6 stages"),
    variant<128, 128, 6, true>("128x128 tiles, 6 stages, pingpong"),
    variant<128, 256, 4, false, 2>("128x256 tiles, 4 stages, 2-CTA clusters"),
    variant<256, 128, 4>("256x128 tiles, 4 stages"),
    variant<128, 256, 3, false, 1, true>("128x256 tiles, 3 stages, TMA-store epilogue"),
};
static_assert(sizeof(kVariants) / sizeof(kVariants[0]) == kGroupedSm90NumVariants);
constexpr int kNumVariants = kGroupedSm90NumVariants;

}  // namespace gg90

int grouped_gemm_sm90_num_variants() { return gg90::kNumVariants; }

const char* grouped_gemm_sm90_variant_name(int variant) {
  return variant >= 0 && variant < gg90::kNumVariants ? gg90::kVariants[variant].name : nullptr;
}

bool grouped_gemm_sm90_supports(int64_t experts, int64_t n, int64_t k) {
  int sms = 0;
  // Rows of 16-byte multiples (TMA strides), int32 coordinates, the tables in shared memory.
  return experts >= 1 && experts <= kGroupedSm90MaxExperts && n % 8 == 0 && k % 8 == 0 &&
         n < (int64_t(1) << 30) && k < (int64_t(1) << 30) && gg90::device_is_sm90_with_sms(&sms);
}

bool grouped_gemm_sm90(const GroupedGemmSm90& g, cudaStream_t stream, int variant) {
  using namespace gg90;
  int sms = 0;
  if (variant < 0 || variant >= kNumVariants || !grouped_gemm_sm90_supports(g.experts, g.n, g.k) ||
      !device_is_sm90_with_sms(&sms) || g.rows >= (int64_t(1) << 31) || !aligned16(g.x) ||
      !aligned16(g.w) || !aligned16(g.y))
    return false;
  if (g.rows == 0 || g.n == 0) return true;  // no output element
  const Variant& v = kVariants[variant];
  Params p{};
  const int64_t k_for_map = std::max<int64_t>(g.k, 8);  // a 0-wide map is invalid; never read then
  encode(&p.tm_a, g.x, k_for_map, g.rows, 1, uint32_t(v.bm), "x");
  if (g.transpose_w)
    encode(&p.tm_b, g.w, k_for_map, g.n, g.experts, uint32_t(v.bn / v.cl), "w [E, n, k]");
  else
    encode(&p.tm_b, g.w, g.n, std::max<int64_t>(g.k, 1), g.experts, 64, "w [E, k, n]");
  if (v.tma_store) encode(&p.tm_y, g.y, g.n, g.rows, 1, 64, "y");
  p.out = g.y;
  p.groups = g.groups;
  p.experts = int(g.experts);
  p.rows = int(g.rows);
  p.n_ext = int(g.n);
  p.k_ext = int(g.k);
  const int64_t max_tiles = (g.rows / v.bm + g.experts) * ((g.n + v.bn - 1) / v.bn);
  (g.transpose_w ? v.fwd : v.dgrad)(p, max_tiles, sms, stream);
  return true;
}

bool grouped_wgrad_sm90(const GroupedWgradSm90& g, cudaStream_t stream, int variant) {
  using namespace gg90;
  int sms = 0;
  if (variant < 0 || variant >= kNumVariants || !grouped_gemm_sm90_supports(g.experts, g.q, g.p) ||
      !device_is_sm90_with_sms(&sms) || g.rows >= (int64_t(1) << 31) || !aligned16(g.a) ||
      !aligned16(g.b) || !aligned16(g.out) || (!g.out_f32 && g.accumulate))
    return false;
  if (g.p == 0 || g.q == 0) return true;  // no output element
  const Variant& v = kVariants[variant];
  Params p{};
  const int64_t rows_for_map = std::max<int64_t>(g.rows, 1);  // never read when 0
  encode(&p.tm_a, g.a, g.p, rows_for_map, 1, 64, "a");
  encode(&p.tm_b, g.b, g.q, rows_for_map, 1, 64, "b");
  p.out = g.out;
  p.groups = g.groups;
  p.experts = int(g.experts);
  p.rows = int(g.rows);
  p.m_ext = int(g.p);
  p.n_ext = int(g.q);
  p.out_f32 = g.out_f32 ? 1 : 0;
  p.accumulate = g.accumulate ? 1 : 0;
  const int64_t max_tiles = g.experts * ((g.p + v.bm - 1) / v.bm) * ((g.q + v.bn - 1) / v.bn);
  v.wgrad(p, max_tiles, sms, stream);
  return true;
}

}  // namespace meshtrain::cuda
