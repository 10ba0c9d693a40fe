// The step-graph dump (graph/graph_dump.h): collective bytes per kind, the summary table per
// (kind, mesh group), and node lines with dtype, shape, memory place, stream and group.
#include <gtest/gtest.h>

#include "meshtrain/graph/graph_dump.h"
#include "meshtrain/graph/passes/assign_streams.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/ops/elementwise.h"
#include "test_support.h"

namespace meshtrain {
namespace {

TEST(GraphDump, SummarisesCollectivesPerKindAndGroupAndListsEveryNode) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{3, 4}, DType::kF32});       // 48 bytes
  ValueId full = ops::all_gather(b, x, MeshGroup::kFsdp, 2);  // 96 bytes gathered
  ValueId y = ops::scale(b, full, 2.0);
  ValueId part = ops::reduce_scatter(b, y, MeshGroup::kFsdp, 2);  // 96 bytes in
  ValueId flat = ops::reshape(b, part, Shape{12});
  ValueId sum = ops::all_reduce(b, flat, MeshGroup::kTp);
  g.mark_output(sum);
  std::map<MeshGroup, int> streams = assign_streams(g);
  EXPECT_EQ(collective_bytes(g, g.node(g.value(full).producer)), 96);
  EXPECT_EQ(collective_bytes(g, g.node(g.value(part).producer)), 96);
  EXPECT_EQ(collective_bytes(g, g.node(g.value(sum).producer)), 48);
  EXPECT_EQ(collective_bytes(g, g.node(g.value(y).producer)), 0);

  const MemoryPlan mp = plan_memory(g, DeviceType::kCPU);
  const std::string text = dump_graphs({{"tiny", &g, &mp}});
  EXPECT_CONTAINS(text, "== tiny: 5 nodes scheduled (forward 5), 6 values\n");
  EXPECT_CONTAINS(text, fmt::format("streams: s0 compute, s{} fsdp, s{} tp\n",
                                    streams.at(MeshGroup::kFsdp), streams.at(MeshGroup::kTp)));
  EXPECT_CONTAINS(text, "  all_gather      fsdp              1         96 B\n");
  EXPECT_CONTAINS(text, "  reduce_scatter  fsdp              1         96 B\n");
  EXPECT_CONTAINS(text, "  all_reduce      tp                1         48 B\n");
  EXPECT_CONTAINS(text,
                  "summary: 3 collectives (1 all_gather, 1 reduce_scatter, 1 all_reduce, "
                  "0 exchange), 240 B\n");
  EXPECT_CONTAINS(
      text, fmt::format("    0  forward   s{:<2} {:<22} %{} float32[6, 4] arena@{}+96 B "
                        "| all_gather fsdp 96 B\n",
                        streams.at(MeshGroup::kFsdp), "all_gather", full, mp.offset[size_t(full)]));
  EXPECT_CONTAINS(text, fmt::format("    3  forward   s0  {:<22} %{} float32[12] view of %{}\n",
                                    "reshape", flat, part));
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(3 << 20), "3.0 MiB");
}

}  // namespace
}  // namespace meshtrain
