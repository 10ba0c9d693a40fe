// Placement names and redistribution through the collective graph ops.
#include "meshtrain/parallel/placement.h"

#include "meshtrain/ops/collective_ops.h"

namespace meshtrain {

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::kReplicate: return "Replicate()";
    case Kind::kShard: return fmt::format("Shard({})", dim);
    case Kind::kPartial: return "Partial(sum)";
  }
  return "?";
}

ValueId redistribute(Builder& b, ValueId x, Placement from, Placement to, MeshGroup group,
                     int group_size) {
  if (from == to || group_size == 1) return x;
  using K = Placement::Kind;
  MT_CHECK((from.kind != K::kShard || from.dim == 0) && (to.kind != K::kShard || to.dim == 0),
           "redistribute over {}: only dim-0 shards are supported, found {} -> {}", group,
           from.to_string(), to.to_string());
  if (from.kind == K::kShard && to.kind == K::kReplicate)
    return ops::all_gather(b, x, group, group_size);
  if (from.kind == K::kPartial && to.kind == K::kShard)
    return ops::reduce_scatter(b, x, group, group_size);
  if (from.kind == K::kPartial && to.kind == K::kReplicate)
    return ops::all_reduce(b, x, group, ReduceOp::kSum, ops::AllReduceGrad::kIdentity);
  MT_THROW(ValueError, "redistribute over {}: {} -> {} is not supported", group, from.to_string(),
           to.to_string());
}

}  // namespace meshtrain
