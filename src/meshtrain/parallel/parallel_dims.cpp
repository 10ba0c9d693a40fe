// ParallelDims validation. Messages follow one pattern: the degrees involved with their values,
// the product or divisor, the world size, and what to change in [parallelism] or the launch.
#include "meshtrain/parallel/parallel_dims.h"

#include "meshtrain/core/check.h"

namespace meshtrain {
namespace {

void check_degree(const char* name, const char* key, int value) {
  MT_CHECK_T(ConfigError, value >= 1, "parallelism degree {}={} must be >= 1 ({} in [parallelism])",
             name, value, key);
}

}  // namespace

void ParallelDims::validate() {
  MT_CHECK_T(ConfigError, world >= 1, "parallelism: world size must be >= 1, found {}", world);
  check_degree("dp_replicate", "data_parallel_replicate_degree", dp_replicate);
  check_degree("cp", "context_parallel_degree", cp);
  check_degree("tp", "tensor_parallel_degree", tp);
  check_degree("ep", "expert_parallel_degree", ep);
  check_degree("etp", "expert_tensor_parallel_degree", etp);
  MT_CHECK_T(ConfigError, dp_shard == -1 || dp_shard >= 1,
             "parallelism degree dp_shard={} must be >= 1, or -1 to use the ranks the other "
             "degrees leave (data_parallel_shard_degree in [parallelism])",
             dp_shard);

  if (dp_shard == -1) {
    int others = dp_replicate * cp * tp;
    MT_CHECK_T(ConfigError, world % others == 0,
               "parallelism degrees dp_replicate={} × cp={} × tp={} = {} do not divide world "
               "size {}, so dp_shard=-1 cannot be resolved (launch with a multiple of {} ranks "
               "or change [parallelism])",
               dp_replicate, cp, tp, others, world, others);
    dp_shard = world / others;
  }
  int product = dp_replicate * dp_shard * cp * tp;
  MT_CHECK_T(ConfigError, product == world,
             "parallelism degrees dp_replicate={} × dp_shard={} × cp={} × tp={} = {} do not match "
             "world size {} (launch with {} ranks or change [parallelism])",
             dp_replicate, dp_shard, cp, tp, product, world, product);

  MT_CHECK_T(ConfigError, etp == 1 || etp == tp,
             "parallelism degree etp={} must be 1 or equal to tp={} "
             "(expert_tensor_parallel_degree in [parallelism], world size {})",
             etp, tp, world);
  if (etp == tp && tp > 1) {
    int pool = dp_shard * cp;
    MT_CHECK_T(ConfigError, pool % ep == 0,
               "parallelism degree ep={} must divide dp_shard={} × cp={} = {} (with etp=tp={}, "
               "expert parallelism borrows ranks from dp_shard × cp only; world size {})",
               ep, dp_shard, cp, pool, tp, world);
  } else {
    int pool = dp_shard * cp * tp;
    MT_CHECK_T(ConfigError, pool % ep == 0,
               "parallelism degree ep={} must divide dp_shard={} × cp={} × tp={} = {} (expert "
               "parallelism borrows ranks from dp_shard × cp × tp; world size {})",
               ep, dp_shard, cp, tp, pool, world);
  }
}

const char* ParallelDims::mode_name() const {
  if (dp_replicate > 1 && fsdp() > 1) return "hybrid_shard";
  if (fsdp() > 1) return "fully_shard";
  if (dp_replicate > 1) return "replicate";
  return "none";
}

std::string ParallelDims::to_string() const {
  return fmt::format("dp_replicate={} dp_shard={} cp={} tp={} ep={} etp={} (world {}, {})",
                     dp_replicate, dp_shard, cp, tp, ep, etp, world, mode_name());
}

}  // namespace meshtrain
