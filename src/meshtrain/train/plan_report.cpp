// plan_report: the same build_step_graph the trainer uses, over a virtual mesh layout.
#include "meshtrain/train/plan_report.h"

#include <algorithm>
#include <map>
#include <set>

#include "meshtrain/data/tokenizer.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ir/op_registry.h"
#include "meshtrain/model/counting.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/cost_model.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/torchtitan_assets.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {
double gib_value(int64_t b) { return double(b) / double(1ull << 30); }
std::string gib(int64_t b) { return fmt::format("{:8.3f} GiB", gib_value(b)); }

// What the activation arena holds at its busiest schedule position (the plan's live peak): the
// values the forward made that are still live (saved for the backward), by producing op, then what
// the backward made and the kernels' workspaces; the parts add up to the live peak.
std::string peak_breakdown(const Graph& g, const MemoryPlan& mp) {
  const int steps = int(mp.schedule.size());
  if (steps == 0 || mp.live_peak_bytes == 0) return "";
  const int peak = mp.live_peak_position;
  std::map<std::string, std::pair<int64_t, int>> saved;  // op -> (bytes, values)
  int64_t saved_bytes = 0, later = 0, workspaces = 0;
  for (const ArenaBlock& b : mp.blocks) {
    if (b.first > peak || b.last < peak) continue;
    if (b.value == kNoValue) {
      workspaces += b.bytes;
      continue;
    }
    const Node& producer = g.node(g.value(b.value).producer);
    if (producer.phase != NodePhase::kForward) {
      later += b.bytes;
      continue;
    }
    auto& [bytes, count] = saved[producer.op];
    bytes += b.bytes;
    ++count;
    saved_bytes += b.bytes;
  }
  std::vector<std::pair<int64_t, std::string>> parts;
  for (const auto& [op, bc] : saved)
    parts.push_back({bc.first, fmt::format("{} {:.2f} ({})", op, gib_value(bc.first), bc.second)});
  std::sort(parts.begin(), parts.end(), std::greater<>());
  std::vector<std::string> top;
  int64_t rest = saved_bytes;
  for (size_t i = 0; i < parts.size() && i < 8; ++i) {
    top.push_back(parts[i].second);
    rest -= parts[i].first;
  }
  if (rest > 0) top.push_back(fmt::format("other {:.2f}", gib_value(rest)));
  const Node& at = g.node(mp.schedule[size_t(peak)]);
  return fmt::format(
      "    at the live peak (node {} of {}: {} {}{}{}):\n"
      "    held from the forward {:.3f} GiB, GiB by producing op (values): {}\n"
      "    made in the backward {:.3f} GiB, kernel workspaces {:.3f} GiB\n",
      peak, steps, node_phase_name(at.phase), at.op, at.scope.empty() ? "" : " at ", at.scope,
      gib_value(saved_bytes), fmt::join(top, ", "), gib_value(later), gib_value(workspaces));
}
}  // namespace

int smallest_world(const JobConfig& cfg) {
  ParallelDims d = parallel_dims_of(cfg, 1);
  const int fixed = d.dp_replicate * std::max(d.dp_shard, 1) * d.cp * d.tp;
  // dp_shard -1 grows in steps of the fixed degrees until expert parallelism divides it; the
  // first world that validates is the answer (else the fixed product's own error is reported).
  const int tries = d.dp_shard == -1 ? std::max(d.ep, 1) * std::max(d.etp, 1) : 1;
  for (int k = 1; k <= tries; ++k) {
    ParallelDims t = parallel_dims_of(cfg, fixed * k);
    try {
      t.validate();
      return fixed * k;
    } catch (const ConfigError&) {
    }
  }
  return fixed;
}

std::string plan_report(const JobConfig& cfg, int world, int rank, bool dump_graph,
                        const PlanCostOptions& cost) {
  const bool chosen = world == 0;
  if (chosen) world = smallest_world(cfg);
  MT_CHECK_T(ConfigError, world >= 1 && rank >= 0 && rank < world,
             "plan: --rank {} must be in [0, --world {})", rank, world);
  ParallelDims dims = parallel_dims_of(cfg, world);
  MeshLayout layout(dims);
  RankGroups groups(layout, rank);
  const DeviceType device_type = resolve_device(cfg.job.device);
  const char* device = device_backend_name(device_type);
  StepGraphOptions so;
  const TokenizerChoice tok_choice = choose_tokenizer(cfg.model.hf_assets_path, true);
  std::unique_ptr<Tokenizer> tok = open_tokenizer(tok_choice);
  so.tokenizer_vocab = tok->vocab_size();
  so.vocab_source = tok->source();
  so.compute_dtype = resolve_compute_dtype(cfg.training.mixed_precision_param, device_type);
  so.master_dtype = cfg.training.master_dtype;
  so.reduce_dtype = cfg.training.mixed_precision_reduce;
  const int64_t accum =
      gradient_accumulation_steps(cfg.training, groups.group_size(MeshGroup::kDp));
  so.overwrite_grads = accum == 1;  // as the trainer builds it
  std::unique_ptr<StepGraph> sg = build_step_graph(cfg, &groups, so);
  ModelCounts c = count_model(*sg->model, *sg->plan, cfg.training.seq_len);
  // Node workspaces are sized by the kernels this build registers for the device (a GPU need not
  // be visible: planning reads sizes only).
  std::set<std::string> missing;
  for (NodeId id : sg->graph.schedule())
    if (!OpRegistry::instance().has_kernel(sg->graph.node(id).op, device_type))
      missing.insert(sg->graph.node(id).op);
  MT_CHECK_T(ConfigError, missing.empty(),
             "plan: [job] device = \"{}\": this build has no {} kernel for {} op(s) of the step "
             "graph ({}); the memory plan sizes each node's scratch from its kernel, so plan with "
             "a build that has the {} backend",
             device, device, missing.size(), fmt::join(missing, ", "), device);
  MemoryPlan mp = plan_memory(sg->graph, device_type);
  const int64_t moments = 2 * mp.parameter_bytes;  // AdamW exp_avg and exp_avg_sq, like masters

  std::string r;
  for (const std::string& note : cfg.notes) r += fmt::format("config:      {}\n", note);
  if (!tok_choice.note.empty()) r += fmt::format("tokenizer:   {}\n", tok_choice.note);
  r += fmt::format("model:       {}\n", sg->model->describe());
  r += fmt::format("parameters:  {} total ({}), {} active ({:.2f}B without the input embedding)\n",
                   human_count(double(c.total_params)), c.total_params,
                   human_count(c.active_params), c.active_non_embedding / 1e9);
  r += fmt::format(
      "flops/token: {:.4g} (training, 6 × active non-embedding params + attention{})\n",
      c.flops_per_token, sg->model->mtp_layers() > 0 ? ", the head once per prediction depth" : "");
  if (const int d = sg->model->mtp_layers(); d > 0) {
    const ModelSection& m = cfg.model;
    r += fmt::format(
        "mtp:         {} module{} ({}), {} parameters; the head runs {}x per token; loss = main "
        "+ {:g} x the depths' mean{}\n",
        d, d == 1 ? "" : "s",
        d == 1 ? fmt::format("block {}", sg->model->n_layers())
               : fmt::format("blocks {}..{}", sg->model->n_layers(), sg->model->num_blocks() - 1),
        human_count(double(c.mtp_params)), d + 1, m.mtp_loss_weight,
        m.mtp_loss_weight_after_step > 0
            ? fmt::format(" ({:g} after step {})", m.mtp_loss_weight_after,
                          m.mtp_loss_weight_after_step)
            : std::string());
  }
  r += fmt::format("layout:      {} | rank {} of {}{}\n", layout.dims().to_string(), rank, world,
                   chosen ? " (the smallest world these degrees fit; --world N for another)" : "");
  r += fmt::format("batch:       local {} × seq {} on {} ({} compute, {} master)\n",
                   cfg.training.local_batch_size, cfg.training.seq_len, device,
                   dtype_name(so.compute_dtype), dtype_name(so.master_dtype));
  r += fmt::format("memory plan of rank {}:\n", rank);
  r += fmt::format("  parameters (master shards) {}\n", gib(mp.parameter_bytes));
  // Mixed precision: the forward reads persistent compute copies the optimizer writes (counted in
  // the total), no per-micro-batch cast of the masters.
  if (mp.compute_copy_bytes > 0)
    r += fmt::format("  {:<27}{}  (written by the optimizer; no casts per micro-batch)\n",
                     fmt::format("compute copies ({})", dtype_name(so.compute_dtype)),
                     gib(mp.compute_copy_bytes));
  r += fmt::format("  gradients                  {}\n", gib(mp.gradient_bytes));
  r += fmt::format("  optimizer moments          {}\n", gib(moments));
  r += fmt::format("  other state                {}\n", gib(mp.state_bytes));
  r += fmt::format("  activations (arena peak)   {}  (live peak {})\n", gib(mp.arena_bytes),
                   gib(mp.live_peak_bytes));
  r += peak_breakdown(sg->graph, mp);
  {
    // Expert-parallel exchanges: the local rows are planned for the expected load (row_capacity.h).
    int64_t exchanges = 0, planned = 0, worst = 0, block = 0, slot = 0;
    for (NodeId id : mp.schedule) {
      const Node& n = sg->graph.node(id);
      if (!OpRegistry::instance().op(n.op).capacity_source) continue;
      ++exchanges;
      planned = std::max(planned, n.attrs.i("capacity"));
      worst = std::max(worst, n.attrs.i("worst_capacity", 0));
      block = std::max(block, n.attrs.i("block_rows", 0));
      slot = std::max(slot, n.attrs.i("slot_rows", 0));
    }
    if (exchanges > 0)
      r += fmt::format(
          "  expert rows (EP)           {} rows per MoE layer planned ([parallelism] "
          "expert_capacity_factor {}; worst case {} rows); a step that needs more takes a pool\n",
          planned, cfg.parallelism.expert_capacity_factor, worst);
    if (block > 0)
      r += fmt::format(
          "  padded expert exchange     blocks of {} rows per peer, slots of {} rows per local "
          "expert, no host wait; a step whose rows do not fit is redone synced\n",
          block, slot);
  }
  r += fmt::format("  inputs                     {}\n", gib(mp.input_bytes));
  r += fmt::format("  total                      {}\n", gib(mp.total_bytes() + moments));
  r += fmt::format("step graph:  {} nodes, {} values", mp.schedule.size(), sg->graph.num_values());
  if (sg->reshard.gathers_recomputed > 0)
    r += fmt::format("; reshard_after_forward re-gathers {} weights in backward ({} not held)",
                     sg->reshard.gathers_recomputed, gib(sg->reshard.bytes_released));
  if (sg->checkpoint.regions > 0)
    r += fmt::format("; activation checkpointing {} recomputes {} nodes in {} blocks",
                     ac_mode_name(cfg.activation_checkpoint.mode), sg->checkpoint.nodes_recomputed,
                     sg->checkpoint.regions);
  r += "\n";
  if (sg->buckets.buckets > 0 || sg->prefetch.gathers_moved > 0) {
    // What prefetching costs: the same graph with one block gathered at a time.
    JobConfig one = cfg;
    one.compile.max_gathered_blocks = 1;
    const MemoryPlan mp1 = plan_memory(build_step_graph(one, &groups, so)->graph, device_type);
    r += fmt::format(
        "scheduling:  {}: {} parameter collectives -> {} ({} buckets); {} gathers prefetched "
        "({} blocks gathered at once): arena {} ({:+.3f} GiB over no prefetch)\n",
        graph_passes_name(cfg.compile.graph_passes), sg->buckets.collectives_before,
        sg->buckets.collectives_after, sg->buckets.buckets, sg->prefetch.gathers_moved,
        cfg.compile.max_gathered_blocks, gib(mp.arena_bytes),
        double(mp.arena_bytes - mp1.arena_bytes) / double(1ull << 30));
  }
  {
    ThroughputTable table = cost.table.empty() ? default_throughput_table(device_type)
                                               : read_throughput_table(cost.table);
    LinkParams links = default_links(device_type);
    if (cost.ranks_per_node > 0) links.ranks_per_node = cost.ranks_per_node;
    if (cost.intra_gbps > 0) links.intra_bytes_per_s = cost.intra_gbps * 1e9;
    if (cost.inter_gbps > 0) links.inter_bytes_per_s = cost.inter_gbps * 1e9;
    if (cost.intra_latency_us > 0) links.intra_latency_s = cost.intra_latency_us * 1e-6;
    if (cost.inter_latency_us > 0) links.inter_latency_s = cost.inter_latency_us * 1e-6;
    const StepCost sc = estimate_step(sg->graph, device_type, dims, groups, table, links, accum);
    r += step_cost_text(sc, table, links, accum);
  }
  if (dump_graph || cfg.job.dump_graph) {
    OptimizerGraph og;
    build_optimizer_graph(og, layout_param_groups(*sg->plan), *sg->plan, adamw_params(cfg, accum),
                          load_balance_options(*sg->plan, groups), cfg.optimizer.overlap_next_step);
    const MemoryPlan omp = plan_memory(og.graph, device_type);
    r += '\n';
    r += dump_step_graphs(sg->graph, mp, accum, og.graph, omp);
  }
  return r;
}

}  // namespace meshtrain
