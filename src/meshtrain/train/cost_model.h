// Cost model of one training step of one rank, read off the scheduled step graph: compute time
// of every node from a table of measured kernel throughputs, communication time of every
// collective from link bandwidth and latency (NVLink inside a node, InfiniBand between nodes by
// default), and the step time after the scheduler's overlap (each stream runs in order, a node
// starts when its inputs are ready; the CPU backend runs the schedule serially). `meshtrain plan`
// prints it (train/plan_report). What it leaves out: stream waits the executor adds for arena
// reuse, the optimizer step, and host work between micro-batches; grouped expert GEMMs are
// counted at their capacity-bound row counts (an upper bound on balanced routing).
#pragma once

#include <map>
#include <string>

#include "meshtrain/core/device.h"
#include "meshtrain/ir/ir.h"
#include "meshtrain/parallel/group_layout.h"
#include "meshtrain/parallel/parallel_dims.h"

namespace meshtrain {

// Kernel throughputs per op: compute-heavy ops in FLOP/s, every other op in bytes/s (both as
// node_work counts them). Ops not
// in the table use the defaults. A table file holds lines `flops OP RATE`, `bytes OP RATE`,
// `default_flops RATE`, `default_bytes RATE`, `source TEXT`; bench/cost/fit_table.py writes them
// from a profiled run's Chrome trace.
struct ThroughputTable {
  std::string source;
  std::map<std::string, double> flops_per_s;
  std::map<std::string, double> bytes_per_s;
  double default_flops_per_s = 0;
  double default_bytes_per_s = 0;
};
ThroughputTable read_throughput_table(const std::string& path);
// Shipped defaults (cost_model.cpp says where each came from).
ThroughputTable default_throughput_table(DeviceType device);

// The work of one node the table prices: FLOPs of a compute-heavy node (attention: the causal
// 2·B·H·S²·(Dqk + Dv)/2, its backward 2.5x that; other heavy ops: 2 × output elements × the last
// dim of input 0), else the bytes it reads and writes (views: 0). The profiler writes both into
// each trace event, so a table fitted from a trace prices exactly what this model counts.
struct NodeWork {
  bool heavy = false;
  int64_t flops = 0;
  int64_t bytes = 0;
};
NodeWork node_work(const Graph& graph, const Node& node);

// Links: a group whose ranks span more than ranks_per_node ranks runs at the inter-node figures.
struct LinkParams {
  double intra_bytes_per_s = 0, intra_latency_s = 0;
  double inter_bytes_per_s = 0, inter_latency_s = 0;
  int ranks_per_node = 8;
};
LinkParams default_links(DeviceType device);

struct CollectiveCost {
  int count = 0;
  int64_t bytes = 0;   // as the graph dump counts them (exchange: the capacity bound)
  double seconds = 0;  // serial time of these collectives
  bool inter_node = false;
};

struct StepCost {
  std::map<std::pair<std::string, std::string>, CollectiveCost> collectives;  // (kind, group)
  double compute_s = 0;        // every non-collective node, serially
  double communication_s = 0;  // every collective, serially
  double step_s = 0;           // after overlap (CPU: compute + communication)
  double exposed_comm_s = 0;   // step_s - compute_s
  int64_t flops = 0;           // FLOPs of the compute-heavy nodes
};

// `runs` micro-batches per optimizer step (the step graph runs that many times).
StepCost estimate_step(const Graph& graph, DeviceType device, const ParallelDims& dims,
                       const GroupLayout& groups, const ThroughputTable& table,
                       const LinkParams& links, int64_t runs);
std::string step_cost_text(const StepCost& c, const ThroughputTable& table, const LinkParams& links,
                           int64_t runs);

}  // namespace meshtrain
