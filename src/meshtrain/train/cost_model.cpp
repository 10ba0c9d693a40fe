// The step cost model: per-node times from the throughput table and the links, then a
// stream-by-stream replay of the schedule (see cost_model.h).
#include "meshtrain/train/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/graph/graph_dump.h"
#include "meshtrain/ir/op_registry.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/matmul.h"

namespace meshtrain {

ThroughputTable read_throughput_table(const std::string& path) {
  std::ifstream in(path);
  MT_CHECK_T(ConfigError, in.good(),
             "cost model: cannot read the throughput table '{}' (write one with "
             "bench/cost/fit_table.py, or leave the key empty for the shipped defaults)",
             path);
  ThroughputTable t;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind) || kind[0] == '#') continue;
    if (kind == "source") {
      std::getline(ls, t.source);
      t.source.erase(0, t.source.find_first_not_of(' '));
      continue;
    }
    std::string op;
    double rate = 0;
    const bool named = kind == "flops" || kind == "bytes";
    if (named) ls >> op;
    ls >> rate;
    MT_CHECK_T(ConfigError, !ls.fail() && rate > 0,
               "cost model: {} line {}: expected `flops OP RATE`, `bytes OP RATE`, "
               "`default_flops RATE`, `default_bytes RATE` or `source TEXT` with RATE > 0, found "
               "'{}'",
               path, n, line);
    if (kind == "flops")
      t.flops_per_s[op] = rate;
    else if (kind == "bytes")
      t.bytes_per_s[op] = rate;
    else if (kind == "default_flops")
      t.default_flops_per_s = rate;
    else if (kind == "default_bytes")
      t.default_bytes_per_s = rate;
    else
      MT_THROW(ConfigError, "cost model: {} line {}: unknown entry '{}'", path, n, kind);
  }
  MT_CHECK_T(ConfigError, t.default_flops_per_s > 0 && t.default_bytes_per_s > 0,
             "cost model: {} needs default_flops and default_bytes lines", path);
  if (t.source.empty()) t.source = path;
  return t;
}

ThroughputTable default_throughput_table(DeviceType device) {
  ThroughputTable t;
  if (device == DeviceType::kCPU) {
    // Measured here: bench/cost/cpu_table.txt (the full per-op table), fitted by
    // bench/cost/measure.sh from a profiled 1-rank DeepSeek-V3 debug run, 1 OpenBLAS thread, on
    // the 2-core build machine while other builds ran (see bench/RESULTS.md).
    t.source = "CPU defaults from bench/cost/cpu_table.txt (measured 2026-12-03, 1 thread)";
    t.default_flops_per_s = 7.454e10;
    t.default_bytes_per_s = 3.159e9;
    t.flops_per_s = {{ops::kMatmulOp, 1.034e11},
                     {"grouped_matmul", 3.355e10},
                     {"grouped_matmul_wgrad", 3.396e10},
                     {"grouped_matmul_wgrad_accumulate", 3.396e10},  // assumed: wgrad's rate
                     {ops::kAttentionOp, 1.048e10},
                     {ops::kAttentionBackwardOp, 1.155e10}};
  } else {
    // H200, from bench/RESULTS.md (2026-12-02): dense GEMMs ~780 TFLOP/s (bench_gemm on model
    // shapes, 623-815), expert GEMMs ~440 (the DeepSeek 16B-4L trace), attention 302 forward /
    // 197 backward at head dims 192/128 (bench_attention, causal ½ S²). Memory-bound ops are
    // ASSUMED at 70% of the 4.8 TB/s datasheet figure (not measured). A table fitted on the GPU
    // (scripts/sched_gpu_bench.sh) replaces all of it.
    t.source =
        "GPU defaults: GEMM/attention rates measured (bench/RESULTS.md 2026-12-02), "
        "memory-bound ops assumed";
    t.default_flops_per_s = 780e12;
    t.default_bytes_per_s = 3.4e12;
    t.flops_per_s = {{"grouped_matmul", 440e12},
                     {"grouped_matmul_wgrad", 440e12},
                     {"grouped_matmul_wgrad_accumulate", 440e12},
                     {ops::kAttentionOp, 302e12},
                     {ops::kAttentionBackwardOp, 197e12}};
  }
  return t;
}

LinkParams default_links(DeviceType device) {
  LinkParams l;
  if (device == DeviceType::kCPU) {
    // Open MPI over shared memory: assumed round figures (a quiet 2-core host moves ~2 GB/s
    // between ranks with ~20 us per collective); override with --intra-gbps/--intra-latency-us.
    l.intra_bytes_per_s = 2.0e9;
    l.intra_latency_s = 20e-6;
    l.inter_bytes_per_s = l.intra_bytes_per_s;
    l.inter_latency_s = l.intra_latency_s;
    l.ranks_per_node = 1 << 20;
  } else {
    // NVLink 4 (H200: 450 GB/s per direction) at ~80% bus bandwidth; InfiniBand NDR 400 Gb/s per
    // GPU (50 GB/s) at ~80%. Latencies: NCCL's usual small-message figures.
    l.intra_bytes_per_s = 360e9;
    l.intra_latency_s = 10e-6;
    l.inter_bytes_per_s = 40e9;
    l.inter_latency_s = 20e-6;
    l.ranks_per_node = 8;
  }
  return l;
}

namespace {

// Consecutive ranks a group's members span (tp innermost, then cp, dp_shard, dp_replicate; ep
// takes its ranks from the inner dims): beyond ranks_per_node it crosses nodes.
int64_t group_extent(MeshGroup g, const ParallelDims& d) {
  switch (g) {
    case MeshGroup::kTp: return d.tp;
    case MeshGroup::kEtp: return d.etp;
    case MeshGroup::kCp: return int64_t(d.cp) * d.tp;
    case MeshGroup::kEp: return int64_t(d.ep) * d.etp;
    case MeshGroup::kDpShard:
    case MeshGroup::kFsdp:
    case MeshGroup::kEfsdp: return int64_t(d.dp_shard) * d.cp * d.tp;
    default: return d.world;
  }
}

double node_seconds(const Graph& g, const Node& n, const ThroughputTable& t, int64_t& flops) {
  const NodeWork w = node_work(g, n);
  if (w.heavy) {
    flops += w.flops;
    auto it = t.flops_per_s.find(n.op);
    return double(w.flops) / (it != t.flops_per_s.end() ? it->second : t.default_flops_per_s);
  }
  auto it = t.bytes_per_s.find(n.op);
  return double(w.bytes) / (it != t.bytes_per_s.end() ? it->second : t.default_bytes_per_s);
}

}  // namespace

NodeWork node_work(const Graph& g, const Node& n) {
  NodeWork w;
  const OpDef& d = OpRegistry::instance().op(n.op);
  if (d.view_of_input >= 0) return w;
  if (d.compute_heavy && !n.inputs.empty()) {
    w.heavy = true;
    const Shape& in0 = g.value(n.inputs[0]).meta.shape;
    if (d.flops) {  // the op counts its own (attention)
      std::vector<TensorMeta> in;
      for (ValueId v : n.inputs) in.push_back(g.value(v).meta);
      w.flops = d.flops(in, n.attrs);
      return w;
    }
    const int64_t k = in0.rank() > 0 ? in0[in0.rank() - 1] : 1;
    for (ValueId v : n.outputs) w.flops += 2 * g.value(v).meta.numel() * k;
    return w;
  }
  for (ValueId v : n.inputs) w.bytes += int64_t(g.value(v).meta.nbytes());
  for (ValueId v : n.outputs) w.bytes += int64_t(g.value(v).meta.nbytes());
  return w;
}

StepCost estimate_step(const Graph& g, DeviceType device, const ParallelDims& dims,
                       const GroupLayout& groups, const ThroughputTable& table,
                       const LinkParams& links, int64_t runs) {
  StepCost c;
  const OpRegistry& reg = OpRegistry::instance();
  std::map<int, double> stream_free;  // stream -> time it is next free
  std::vector<double> done(size_t(g.num_nodes()), 0);
  for (NodeId id : g.schedule()) {
    const Node& n = g.node(id);
    const OpDef& d = reg.op(n.op);
    double t = 0;
    if (d.is_collective()) {
      const MeshGroup group = n.attrs.group();
      const int64_t k = std::max<int64_t>(1, groups.group_size(group));
      const bool inter = group_extent(group, dims) > links.ranks_per_node;
      const double bw = inter ? links.inter_bytes_per_s : links.intra_bytes_per_s;
      const double lat = inter ? links.inter_latency_s : links.intra_latency_s;
      // The exchange's receive buffer is the capacity bound (what the dump shows); balanced
      // routing receives what it sends, the input rows.
      const int64_t bytes = d.collective == Collective::kExchange
                                ? int64_t(g.value(n.inputs.at(0)).meta.nbytes())
                                : collective_bytes(g, n);
      // Ring bus traffic: (k-1)/k of the buffer per rank, twice for an all-reduce; latency
      // grows with log2 k (NCCL's trees and rings pipelined).
      const double factor =
          (d.collective == Collective::kAllReduce ? 2.0 : 1.0) * double(k - 1) / double(k);
      t = lat * std::max(1.0, std::ceil(std::log2(double(k)))) + double(bytes) * factor / bw;
      CollectiveCost& cc = c.collectives[{collective_name(d.collective), mesh_group_name(group)}];
      ++cc.count;
      cc.bytes += bytes;
      cc.seconds += t;
      cc.inter_node = inter;
      c.communication_s += t;
    } else {
      t = node_seconds(g, n, table, c.flops);
      c.compute_s += t;
    }
    // The CPU backend runs every node in schedule order, synchronously: one timeline.
    const int stream = device == DeviceType::kCPU ? 0 : n.stream;
    double start = stream_free[stream];
    for (ValueId v : n.inputs) {
      const NodeId p = g.value(v).producer;
      if (p != kNoNode) start = std::max(start, done[size_t(p)]);
    }
    done[size_t(id)] = start + t;
    stream_free[stream] = start + t;
  }
  double end = 0;
  for (const auto& [s, free] : stream_free) end = std::max(end, free);
  const double r = double(runs);
  c.compute_s *= r;
  c.communication_s *= r;
  c.step_s = end * r;
  c.exposed_comm_s = std::max(0.0, c.step_s - c.compute_s);
  c.flops *= runs;
  for (auto& [key, cc] : c.collectives) {
    cc.count *= int(runs);
    cc.bytes *= runs;
    cc.seconds *= r;
  }
  return c;
}

std::string step_cost_text(const StepCost& c, const ThroughputTable& table, const LinkParams& links,
                           int64_t runs) {
  auto ms = [](double s) { return fmt::format("{:10.3f} ms", s * 1e3); };
  std::string r = fmt::format("cost model (one optimizer step of this rank, {} micro-batch{}):\n",
                              runs, runs == 1 ? "" : "es");
  r += fmt::format("  kernels: {}\n", table.source);
  r += fmt::format(
      "  links:   intra-node {:.0f} GB/s {:.0f} us, inter-node {:.0f} GB/s {:.0f} us, {} ranks "
      "per node\n",
      links.intra_bytes_per_s / 1e9, links.intra_latency_s * 1e6, links.inter_bytes_per_s / 1e9,
      links.inter_latency_s * 1e6, links.ranks_per_node);
  r += "  collective      group          count        bytes         time  link\n";
  for (const auto& [key, cc] : c.collectives)
    r += fmt::format("  {:<15} {:<10} {:>9} {:>12} {}  {}\n", key.first, key.second, cc.count,
                     human_bytes(cc.bytes), ms(cc.seconds), cc.inter_node ? "inter" : "intra");
  r += fmt::format("  compute        {}  ({:.3g} FLOP in compute-heavy kernels)\n", ms(c.compute_s),
                   double(c.flops));
  r += fmt::format("  communication  {}  (serial)\n", ms(c.communication_s));
  r += fmt::format(
      "  step           {}  (exposed communication {}, {:.0f}% hidden)\n", ms(c.step_s),
      ms(c.exposed_comm_s),
      c.communication_s > 0 ? 100.0 * (1.0 - c.exposed_comm_s / c.communication_s) : 100.0);
  return r;
}

}  // namespace meshtrain
