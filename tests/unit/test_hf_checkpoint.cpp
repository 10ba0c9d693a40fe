// Hugging Face export and import of a run's parameters: names and Llama's q/k permutation as
// torchtitan's adapters define them, bitwise round trips on one rank and across rank layouts
// (virtual ranks in threads), bfloat16 export, fp8 block dequantisation against a float64
// reference, and the errors of a folder that does not fit the model.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "hf_rank_run.h"
#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/checkpoint/hf_export.h"
#include "meshtrain/checkpoint/hf_io.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kDs = {"--model.name", "deepseek_v3",      "--model.flavor",
                                      "debugmodel",   "--model.n_layers", "2"};

// Non-zero expert biases, the same on every rank (they are replicated state).
void set_biases(RankRun& r) {
  for (const ParamInfo& p : r.sg->plan->params()) {
    if (p.name.find(".expert_bias") == std::string::npos) continue;
    Tensor t = r.store->master(p.name);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.001f * float(i % 5) - 0.002f;
  }
}

// Bitwise equality of every parameter and expert bias (token counters excluded).
void expect_same_state(const RankRun& a, const RankRun& b) {
  for (const ParamInfo& p : a.sg->plan->params()) {
    if (p.name.find("tokens_per_expert") != std::string::npos) continue;
    Tensor x = a.store->master(p.name), y = b.store->master(p.name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << p.name;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << p.name << " differs";
  }
}

// Saves from `world` virtual ranks of cfg at once (threads; the barrier is a std::barrier).
void save_layout(const JobConfig& cfg, int world, const std::string& folder, const HfSaveOptions& o,
                 bool biases = false) {
  std::vector<RankRun> runs;
  for (int r = 0; r < world; ++r) {
    runs.push_back(make_run(cfg, world, r));
    if (biases) set_biases(runs.back());
  }
  std::barrier sync(world);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        save_hf_from_store(folder, runs[size_t(r)].ctx([&] { sync.arrive_and_wait(); }), o);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        sync.arrive_and_drop();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
}

class HfCheckpoint : public testing::TempDirTest {};

// A DeepSeek-V3-layout config.json small enough for tests.
json tiny_v3_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 3, "first_k_dense_replace": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_routed_experts": 16, "n_shared_experts": 1,
    "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    "q_lora_rank": 16, "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
    "v_head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "max_position_embeddings": 64, "tie_word_embeddings": false,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16}
  })");
}

TEST(HfMapping, LlamaRotaryRowsFollowTorchtitansPermute) {
  // torchtitan's _permute: w.view(heads, hd/2, 2, dim).transpose(1, 2): HF row (h, j, i) is
  // meshtrain row (h, i, j) — pair element j of rotary pair i.
  EXPECT_EQ(hf_row_of_meta_row(0, 4), 0);
  EXPECT_EQ(hf_row_of_meta_row(1, 4), 2);
  EXPECT_EQ(hf_row_of_meta_row(2, 4), 1);
  EXPECT_EQ(hf_row_of_meta_row(3, 4), 3);
  EXPECT_EQ(hf_row_of_meta_row(8 + 5, 8), 8 + 4 + 2);  // head 1, pair 2, second element
  std::vector<int> seen(64, 0);
  for (int r = 0; r < 64; ++r) ++seen[size_t(hf_row_of_meta_row(r, 16))];
  for (int c : seen) EXPECT_EQ(c, 1) << "the permutation must be a bijection";
}

TEST(HfMapping, NamesFollowTheHfModels) {
  RankRun l = make_run(testing::tiny_job());
  HfLayout ll(*l.sg->model, l.sg->plan->params());
  ASSERT_NE(ll.find("model.layers.1.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(ll.find("model.layers.1.self_attn.q_proj.weight")->param,
            "layers.1.attention.wq.weight");
  EXPECT_EQ(ll.find("model.layers.1.self_attn.k_proj.weight")->rope_heads, 4);
  EXPECT_EQ(ll.find("model.layers.0.mlp.up_proj.weight")->param, "layers.0.feed_forward.w3.weight");
  EXPECT_EQ(ll.tensors().front().hf_name, "model.embed_tokens.weight");
  EXPECT_EQ(ll.tensors().back().hf_name, "lm_head.weight");
  RankRun d = make_run(testing::tiny_job(kDs));
  HfLayout dl(*d.sg->model, d.sg->plan->params());
  const HfTensor* e = dl.find("model.layers.1.mlp.experts.7.down_proj.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->param, "layers.1.moe.experts.w2");
  EXPECT_EQ(e->expert, 7);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(dl.find("model.layers.1.mlp.gate.e_score_correction_bias")->param,
            "layers.1.moe.expert_bias");
  EXPECT_NE(dl.find("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), nullptr);
  EXPECT_NE(dl.find("model.layers.1.mlp.shared_experts.gate_proj.weight"), nullptr);
  EXPECT_EQ(dl.find("model.layers.1.moe.tokens_per_expert"), nullptr);
}

TEST_F(HfCheckpoint, DeepSeekV3LayoutWithQLoraAndSigmoidGroupsRoundTrips) {
  // The 671B layout in miniature (q_lora, sigmoid scores, 4 groups of which 2, route scale,
  // 2 dense layers, YaRN), from a config.json: names, then a bitwise round trip.
  const std::string cfg_path = write("v3/config.json", tiny_v3_config().dump());
  JobConfig cfg = testing::tiny_job({"--model.name", "deepseek_v3", "--model.hf_config", cfg_path});
  RankRun a = make_run(cfg);
  HfLayout ql(*a.sg->model, a.sg->plan->params());
  EXPECT_EQ(ql.find("model.layers.0.self_attn.q_a_layernorm.weight")->param,
            "layers.0.attention.q_norm.weight");
  EXPECT_NE(ql.find("model.layers.0.self_attn.q_b_proj.weight"), nullptr);
  EXPECT_EQ(ql.find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_NE(ql.find("model.layers.1.mlp.down_proj.weight"), nullptr);  // dense layer 1 of 2
  EXPECT_NE(ql.find("model.layers.2.mlp.experts.15.up_proj.weight"), nullptr);
  set_biases(a);
  save_hf_from_store((dir_ / "out").string(), a.ctx(), {});
  json c = json::parse(std::ifstream(dir_ / "out" / "config.json"));
  EXPECT_EQ(c["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(c["topk_method"], "noaux_tc");
  EXPECT_EQ(c["n_group"], 4);
  EXPECT_EQ(c["q_lora_rank"], 16);
  EXPECT_EQ(c["rope_scaling"]["factor"], 4.0);
  RankRun b = make_run(cfg, 1, 0, 2);
  load_hf_into_store((dir_ / "out").string(), b.ctx());
  expect_same_state(a, b);
}

TEST_F(HfCheckpoint, LlamaAndDeepSeekRoundTripBitwiseOnOneRank) {
  for (const auto& extra : {std::vector<std::string>{}, kDs}) {
    JobConfig cfg = testing::tiny_job(extra);
    RankRun a = make_run(cfg);
    set_biases(a);
    const std::string folder = (dir_ / cfg.model.name).string();
    save_hf_from_store(folder, a.ctx(), {});
    EXPECT_TRUE(fs::exists(fs::path(folder) / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(folder + ".tmp"));
    RankRun b = make_run(cfg, 1, 0, 99);  // other values everywhere
    load_hf_into_store(folder, b.ctx());
    expect_same_state(a, b);
  }
}

TEST_F(HfCheckpoint, ExportOnFsdpEpTpLayoutsImportsOnOthersBitwise) {
  // Written by FSDP 2 x EP 2 (4 ranks), by FSDP 2 x TP 2 x EP 2 (ETP 1); read on 1 rank and on
  // HSDP 2x2 + EP 2: every piece equals the seeded initialisation of that layout.
  const std::vector<std::vector<std::string>> writers = {
      {"--parallelism.data_parallel_shard_degree", "4", "--parallelism.expert_parallel_degree",
       "2"},
      {"--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2",
       "--parallelism.expert_parallel_degree", "2"}};
  int n = 0;
  for (const auto& w : writers) {
    std::vector<std::string> o = kDs;
    o.insert(o.end(), w.begin(), w.end());
    const std::string folder = (dir_ / fmt::format("w{}", n++)).string();
    save_layout(testing::tiny_job(o), 4, folder, {.max_shard_bytes = 4 << 20}, true);
    EXPECT_GT(std::distance(fs::directory_iterator(folder), fs::directory_iterator()), 4)
        << "4 MiB shards: several files";
    JobConfig one = testing::tiny_job(kDs);
    RankRun ref = make_run(one);
    set_biases(ref);
    RankRun got = make_run(one, 1, 0, 5);
    load_hf_into_store(folder, got.ctx());
    expect_same_state(ref, got);
    std::vector<std::string> h = kDs;
    for (const char* s : {"--parallelism.data_parallel_replicate_degree", "2",
                          "--parallelism.data_parallel_shard_degree", "2",
                          "--parallelism.expert_parallel_degree", "2"})
      h.push_back(s);
    JobConfig hsdp = testing::tiny_job(h);
    for (int r : {0, 3}) {
      RankRun want = make_run(hsdp, 4, r);
      set_biases(want);
      RankRun loaded = make_run(hsdp, 4, r, 5);
      load_hf_into_store(folder, loaded.ctx());
      expect_same_state(want, loaded);
    }
  }
}

TEST_F(HfCheckpoint, Bfloat16ExportRoundsEachWeightOnce) {
  JobConfig cfg = testing::tiny_job();
  RankRun a = make_run(cfg);
  const std::string folder = (dir_ / "bf16").string();
  save_hf_from_store(folder, a.ctx(), {.dtype = FileDType::kBF16});
  json c = json::parse(std::ifstream(fs::path(folder) / "config.json"));
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  RankRun b = make_run(cfg, 1, 0, 3);
  load_hf_into_store(folder, b.ctx());
  const Tensor x = a.store->master("layers.0.attention.wv.weight");
  const Tensor y = b.store->master("layers.0.attention.wv.weight");
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(y.data<float>()[i], BFloat16::to_float(BFloat16::from_float(x.data<float>()[i])));
}

TEST_F(HfCheckpoint, GradientsFileHoldsEveryTrainableParameterUnderItsHfName) {
  JobConfig cfg = testing::tiny_job(kDs);
  RankRun a = make_run(cfg);
  for (const ParamInfo& p : a.sg->plan->params()) {
    if (!p.trainable) continue;
    Tensor g = a.store->grad(p.name);
    for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = float(i % 7) * 0.5f;
  }
  fs::create_directories(dir_ / "dump");
  save_hf_from_store((dir_ / "dump").string(), a.ctx(), {.what = HfSaveWhat::kGradients});
  SafetensorsReader r((dir_ / "dump" / "gradients.safetensors").string());
  const SafetensorsEntry& e = r.at("model.layers.1.mlp.experts.3.gate_proj.weight");
  std::vector<float> v(size_t(e.numel()));
  r.read(e, v.data(), v.size() * 4);
  // Expert 3 of w1 [8, 256, 256] starts at element 3 * 65536 of the stacked gradient.
  EXPECT_EQ(v[5], float((3 * 65536 + 5) % 7) * 0.5f);
  EXPECT_EQ(r.find("model.layers.1.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_FALSE(fs::exists(dir_ / "dump" / "gradients.safetensors.tmp"));
}

}  // namespace
}  // namespace meshtrain
