// Hugging Face load and export of DeepSeek-V3's multi-token-prediction (MTP)
// layers: module k under the release's names as model.layers.{L + k - 1}, the
// copies of the shared embedding and head it carries (written, checked on load,
// never read), bitwise round trips from one rank and from FSDP ranks, fp8 MTP
// weights, and the messages of a folder whose MTP layers differ from
// mtp_layers.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "hf_rank_run.h"
#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/checkpoint/hf_io.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/convert.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The V3 layout in miniature: 3 layers (2 dense), so MTP module k is block 2 +
// k, a MoE block as in the release.
constexpr const char* kTinyV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
  "num_hidden_layers": 3, "first_k_dense_replace": 2, "num_attention_heads": 4,
  "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc",
  "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
  "q_lora_rank": 16, "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
  "max_position_embeddings": 64, "tie_word_embeddings": false})";

bool is_counter(const std::string& n) { return n.find("tokens_per_expert") != std::string::npos; }

// Bitwise equality of every parameter and expert bias of `a` with the same one
// of `b`; `b` may lack the MTP modules (then only the main model's are
// compared).
void expect_same_state(const RankRun& a, const RankRun& b) {
  int compared = 0;
  for (const ParamInfo& p : b.sg->plan->params()) {
    if (is_counter(p.name)) continue;
    EXPECT_EQ(a.host(p.name), b.host(p.name)) << p.name << " differs";
    ++compared;
  }
  EXPECT_GT(compared, 20);
}

std::vector<float> read_f32(const fs::path& folder, const std::string& hf_name) {
  HfFolder f(folder.string());
  const HfFolder::Entry* e = f.find(hf_name);
  EXPECT_NE(e, nullptr) << hf_name;
  if (!e) return {};
  std::vector<float> v(size_t(e->tensor->numel()));
  e->file->read(*e->tensor, v.data(), v.size() * 4);
  return v;
}

class HfMtp : public testing::TempDirTest {
 protected:
  // A deepseek_v3 job from kTinyV3 with `mtp` MTP modules; `extra` overrides
  // follow.
  JobConfig job(int mtp, const std::vector<std::string>& extra = {}) {
    if (config_.empty()) config_ = write("v3/config.json", kTinyV3);
    std::vector<std::string> o = {"--model.name", "deepseek_v3",        "--model.hf_config",
                                  config_,        "--model.mtp_layers", std::to_string(mtp)};
    o.insert(o.end(), extra.begin(), extra.end());
    return testing::tiny_job(o);
  }
  // An HF folder saved from a seeded run with `mtp` modules.
  std::string saved(int mtp, const std::string& name, uint64_t seed = 11) {
    RankRun a = make_run(job(mtp), 1, 0, seed);
    const std::string folder = (dir_ / name).string();
    save_hf_from_store(folder, a.ctx(), {});
    return folder;
  }
  std::string config_;
};

TEST_F(HfMtp, ModulesTakeTheReleaseNames) {
  RankRun a = make_run(job(2), 1, 0, 1);
  HfLayout l(*a.sg->model, a.sg->plan->params());
  EXPECT_EQ(l.mtp_layers(), 2);
  const std::vector<std::pair<const char*, const char*>> names = {
      {"model.layers.3.enorm.weight", "layers.3.enorm.weight"},
      {"model.layers.3.hnorm.weight", "layers.3.hnorm.weight"},
      {"model.layers.4.eh_proj.weight", "layers.4.eh_proj.weight"},
      {"model.layers.4.shared_head.norm.weight", "layers.4.final_norm.weight"},
      {"model.layers.3.self_attn.q_a_proj.weight", "layers.3.attention.wq_a.weight"},
      {"model.layers.4.input_layernorm.weight", "layers.4.attention_norm.weight"},
      {"model.layers.3.mlp.gate.e_score_correction_bias", "layers.3.moe.expert_bias"},
      {"model.layers.4.mlp.shared_experts.down_proj.weight",
       "layers.4.moe.shared_experts.w2.weight"},
  };
  for (const auto& [hf, ours] : names) {
    const HfTensor* t = l.find(hf);
    ASSERT_NE(t, nullptr) << hf;
    EXPECT_EQ(t->param, ours);
    EXPECT_FALSE(t->shared_copy);
  }
  EXPECT_EQ(l.find("model.layers.3.eh_proj.weight")->shape, (std::vector<int64_t>{64, 128}));
  const HfTensor* e = l.find("model.layers.4.mlp.experts.7.gate_proj.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->param, "layers.4.moe.experts.w1");
  EXPECT_EQ(e->expert, 7);
  for (int b : {3, 4}) {
    const HfTensor* emb = l.find(fmt::format("model.layers.{}.embed_tokens.weight", b));
    const HfTensor* head = l.find(fmt::format("model.layers.{}.shared_head.head.weight", b));
    ASSERT_TRUE(emb && head) << b;
    EXPECT_TRUE(emb->shared_copy && head->shared_copy);
    EXPECT_EQ(emb->param, "tok_embeddings.weight");
    EXPECT_EQ(head->param, "output.weight");
    EXPECT_EQ(head->shape, (std::vector<int64_t>{300, 64}));
  }
  EXPECT_EQ(l.copies_of("tok_embeddings.weight").size(), 2u);
  EXPECT_EQ(l.locate("tok_embeddings.weight", 0, 5).tensor->hf_name, "model.embed_tokens.weight");
  // The release's order: the main model, its norm and head, then the MTP
  // layers.
  EXPECT_EQ(l.tensors().front().hf_name, "model.embed_tokens.weight");
  size_t head_at = 0, first_mtp = 0;
  for (size_t i = 0; i < l.tensors().size(); ++i) {
    if (l.tensors()[i].hf_name == "lm_head.weight") head_at = i;
    if (!first_mtp && l.tensors()[i].hf_name.rfind("model.layers.3.", 0) == 0) first_mtp = i;
  }
  EXPECT_LT(head_at, first_mtp);
  // A gradient file holds each parameter once: no copies.
  HfLayout g(*a.sg->model, a.sg->plan->params(), false);
  EXPECT_EQ(g.find("model.layers.3.embed_tokens.weight"), nullptr);
  EXPECT_NE(g.find("model.layers.3.eh_proj.weight"), nullptr);
  // No MTP modules: no MTP names.
  RankRun z = make_run(job(0), 1, 0, 1);
  HfLayout zl(*z.sg->model, z.sg->plan->params());
  EXPECT_EQ(zl.mtp_layers(), 0);
  EXPECT_EQ(zl.find("model.layers.3.enorm.weight"), nullptr);
}

TEST_F(HfMtp, RoundTripIsBitwiseAndWritesTheSharedCopies) {
  RankRun a = make_run(job(2), 1, 0, 11);
  const fs::path folder = dir_ / "d2";
  save_hf_from_store(folder.string(), a.ctx(), {.max_shard_bytes = 1 << 20});
  json c = json::parse(std::ifstream(folder / "config.json"));
  EXPECT_EQ(c["num_nextn_predict_layers"], 2);
  EXPECT_EQ(c["num_hidden_layers"], 3);
  json idx = json::parse(std::ifstream(folder / "model.safetensors.index.json"));
  EXPECT_TRUE(idx["weight_map"].contains("model.layers.4.shared_head.head.weight"));
  // Each module's copies hold the main tensors' values.
  const std::vector<float> emb = a.host("tok_embeddings.weight"), head = a.host("output.weight");
  for (int b : {3, 4}) {
    EXPECT_EQ(read_f32(folder, fmt::format("model.layers.{}.embed_tokens.weight", b)), emb);
    EXPECT_EQ(read_f32(folder, fmt::format("model.layers.{}.shared_head.head.weight", b)), head);
  }
  EXPECT_EQ(read_f32(folder, "model.layers.4.eh_proj.weight"), a.host("layers.4.eh_proj.weight"));
  RankRun b = make_run(job(2), 1, 0, 99);
  load_hf_into_store(folder.string(), b.ctx());
  expect_same_state(a, b);
}

TEST_F(HfMtp, FsdpRanksWriteWhatOneRankReadsBitwise) {
  // 4 virtual ranks (FSDP 2 x EP 2) write; 1 rank and FSDP 4 ranks read.
  const std::vector<std::string> fsdp_ep = {"--parallelism.data_parallel_shard_degree", "4",
                                            "--parallelism.expert_parallel_degree", "2"};
  const int world = 4;
  std::vector<RankRun> runs;
  for (int r = 0; r < world; ++r) runs.push_back(make_run(job(1, fsdp_ep), world, r, 11));
  const std::string folder = (dir_ / "fsdp").string();
  std::barrier sync(world);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        save_hf_from_store(folder, runs[size_t(r)].ctx([&] { sync.arrive_and_wait(); }), {});
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        sync.arrive_and_drop();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  RankRun want = make_run(job(1), 1, 0, 11);
  RankRun got = make_run(job(1), 1, 0, 5);
  load_hf_into_store(folder, got.ctx());
  expect_same_state(want, got);
  EXPECT_EQ(read_f32(folder, "model.layers.3.embed_tokens.weight"),
            want.host("tok_embeddings.weight"));
  for (int r : {1, 2}) {
    RankRun piece = make_run(job(1, fsdp_ep), world, r, 11);
    RankRun loaded = make_run(job(1, fsdp_ep), world, r, 7);
    load_hf_into_store(folder, loaded.ctx());
    expect_same_state(piece, loaded);
  }
}

TEST_F(HfMtp, FolderWithOtherMtpLayersIsAnErrorNamingBothAndTheKey) {
  const std::string d2 = saved(2, "d2");
  RankRun one = make_run(job(1), 1, 0, 3);
  testing::expect_error(
      ErrorKind::kConfig, [&] { load_hf_into_store(d2, one.ctx()); },
      "num_nextn_predict_layers: config.json 2, meshtrain [model] mtp_layers 1 "
      "(set [model] "
      "mtp_layers = 2 to load the folder's MTP layers, or 0 to skip them)");
  const std::string d0 = saved(0, "d0");
  testing::expect_error(
      ErrorKind::kConfig, [&] { load_hf_into_store(d0, one.ctx()); },
      "num_nextn_predict_layers: config.json 0, meshtrain [model] mtp_layers 1 "
      "(the folder has no "
      "MTP layers to load: set [model] mtp_layers = 0)");
}

TEST_F(HfMtp, ModelWithoutMtpLoadsTheMainModelAndSaysTheMtpLayersWereNotLoaded) {
  RankRun a = make_run(job(2), 1, 0, 11);
  const std::string folder = (dir_ / "d2").string();
  save_hf_from_store(folder, a.ctx(), {});
  RankRun z = make_run(job(0), 1, 0, 4);
  const HfLoadReport rep = load_hf_into_store(folder, z.ctx());
  int said = 0;
  for (const std::string& n : rep.notes)
    said += n ==
            "2 MTP layers (num_nextn_predict_layers = 2) were not loaded: "
            "[model] mtp_layers = 0 "
            "(set [model] mtp_layers = 2 to load and train them)";
  EXPECT_EQ(said, 1) << fmt::format("{}", fmt::join(rep.notes, " | "));
  expect_same_state(a, z);  // every parameter z has
}

TEST_F(HfMtp, SharedCopiesAreCheckedAgainstTheMainTensorsNotRead) {
  RankRun a = make_run(job(1), 1, 0, 11);
  const fs::path folder = dir_ / "d1";
  save_hf_from_store(folder.string(), a.ctx(), {});
  // Without the copies (a folder that drops them) the load is the same.
  const fs::path index = folder / "model.safetensors.index.json";
  const std::string full_index = read_text_file(index.string());
  json idx = json::parse(full_index);
  idx["weight_map"].erase("model.layers.3.embed_tokens.weight");
  idx["weight_map"].erase("model.layers.3.shared_head.head.weight");
  std::ofstream(index) << idx.dump();
  RankRun b = make_run(job(1), 1, 0, 2);
  load_hf_into_store(folder.string(), b.ctx());
  expect_same_state(a, b);
  // A copy that differs from the main tensor in one element is named with the
  // element.
  std::ofstream(index) << full_index;
  const std::string copy = "model.layers.3.shared_head.head.weight";
  const std::string shard =
      (folder / json::parse(full_index)["weight_map"][copy].get<std::string>()).string();
  const int64_t at = SafetensorsReader(shard).at(copy).begin + (7 * 64 + 5) * 4;
  const float changed = a.host("output.weight")[7 * 64 + 5] + 1.0f;
  {
    std::fstream io(shard, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(at);
    io.write(reinterpret_cast<const char*>(&changed), 4);
  }
  RankRun c = make_run(job(1), 1, 0, 2);
  testing::expect_error(
      ErrorKind::kValue, [&] { load_hf_into_store(folder.string(), c.ctx()); },
      "model.layers.3.shared_head.head.weight differs from lm_head.weight at "
      "row 7 column 5");
}

TEST_F(HfMtp, Fp8MtpWeightsDequantiseLikeTheRest) {
  // The release stores the MTP layer's matrices as e4m3 with a scale per block
  // (its embedding and head copies stay bfloat16): re-store every matrix of
  // model.layers.3 that way (16x16 blocks, partial edge blocks) and check each
  // loaded element against the float64 product.
  const int64_t B = 16;
  const fs::path plain = saved(1, "plain"), fp8 = dir_ / "fp8";
  fs::create_directories(fp8);
  json c = json::parse(std::ifstream(plain / "config.json"));
  c["quantization_config"] = {
      {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {B, B}}};
  std::ofstream(fp8 / "config.json") << c.dump();
  HfFolder src(plain.string());
  SafetensorsWriter w((fp8 / "model.safetensors").string());
  std::map<std::string, std::vector<uint8_t>> codes;
  std::map<std::string, std::vector<float>> scales;
  std::mt19937_64 rng(3);
  const std::vector<std::string> names = src.names();
  for (const std::string& n : names) {
    const SafetensorsEntry& e = *src.find(n)->tensor;
    const bool quantise = n.rfind("model.layers.3.", 0) == 0 && e.shape.size() == 2 &&
                          n.find("embed_tokens") == std::string::npos &&
                          n.find("shared_head.head") == std::string::npos;
    if (!quantise) {
      w.add(n, e.dtype, e.shape);
      continue;
    }
    const int64_t R = e.shape[0], C = e.shape[1];
    auto& q = codes[n];
    q.resize(size_t(R * C));
    for (auto& v : q) {
      do v = uint8_t(rng());
      while ((v & 0x7f) == 0x7f);  // any finite code
    }
    auto& s = scales[n];
    s.resize(size_t(((R + B - 1) / B) * ((C + B - 1) / B)));
    for (auto& v : s) v = std::ldexp(float(rng() % 1000 + 1), -16);
    w.add(n, FileDType::kF8E4M3, e.shape);
    w.add(n + "_scale_inv", FileDType::kF32, {(R + B - 1) / B, (C + B - 1) / B});
  }
  for (const std::string& n : names) {
    if (codes.count(n)) {
      w.write(codes[n].data(), codes[n].size());
      w.write(scales[n].data(), scales[n].size() * 4);
      continue;
    }
    const HfFolder::Entry& e = *src.find(n);
    std::vector<std::byte> raw(size_t(e.tensor->nbytes()));
    e.file->read(*e.tensor, raw.data(), raw.size());
    w.write(raw.data(), raw.size());
  }
  w.finish();
  EXPECT_TRUE(codes.count("model.layers.3.eh_proj.weight"));
  EXPECT_TRUE(codes.count("model.layers.3.mlp.experts.5.down_proj.weight"));
  RankRun r = make_run(job(1), 1, 0, 8);
  load_hf_into_store(fp8.string(), r.ctx());
  HfLayout layout(*r.sg->model, r.sg->plan->params());
  int64_t checked = 0;
  for (const auto& [n, q] : codes) {
    const HfTensor* t = layout.find(n);
    ASSERT_NE(t, nullptr) << n;
    const std::vector<float> m = r.host(t->param);
    const int64_t R = t->shape[0], C = t->shape[1], sc = (C + B - 1) / B;
    const int64_t base = std::max<int64_t>(t->expert, 0) * R * C;
    for (int64_t row = 0; row < R; ++row)
      for (int64_t col = 0; col < C; ++col) {
        const double want = double(e4m3_to_float(q[size_t(row * C + col)])) *
                            double(scales.at(n)[size_t((row / B) * sc + col / B)]);
        ASSERT_EQ(m[size_t(base + row * C + col)], float(want))
            << n << " [" << row << ", " << col << "]";
        ++checked;
      }
  }
  EXPECT_GT(checked, 50000);
}

TEST_F(HfMtp, LastSaveInHfAndConvertCarryTheMtpModules) {
  // Train 2 steps with one MTP module and save the last step in HF layout; start a run from that
  // folder; convert it to a checkpoint (the model config.json describes: its MTP layer included)
  // and back to HF: every tensor of both folders, copies included, is the same bytes.
  const fs::path run = dir_ / "run";
  std::map<std::string, std::vector<float>> final_weights;
  {
    Trainer t(
        job(1, {"--job.dump_folder", run.string(), "--training.steps", "2", "--checkpoint.enable",
                "true", "--checkpoint.last_save_in_hf", "true", "--checkpoint.interval", "100"}),
        testing::test_runtime());
    t.step(), t.step();
    t.wait_for_checkpoint();
    for (const ParamInfo& p : t.plan().params())
      if (!is_counter(p.name))
        final_weights[p.name] = t.params().master_to_host(p.name).to_vector<float>();
  }
  EXPECT_TRUE(final_weights.count("layers.3.eh_proj.weight"));
  const fs::path hf = run / "checkpoint" / "step-2";
  json c = json::parse(std::ifstream(hf / "config.json"));
  EXPECT_EQ(c["num_nextn_predict_layers"], 1);
  EXPECT_EQ(read_f32(hf, "model.layers.3.shared_head.head.weight"),
            final_weights.at("output.weight"));
  {
    Trainer t(job(1, {"--job.dump_folder", (dir_ / "b").string(), "--checkpoint.enable", "true",
                      "--checkpoint.initial_load_path", hf.string(),
                      "--checkpoint.initial_load_in_hf", "true"}),
              testing::test_runtime());
    for (const auto& [name, v] : final_weights)
      EXPECT_EQ(t.params().master_to_host(name).to_vector<float>(), v) << name;
  }
  const std::string ckpt = (dir_ / "ckpt").string(), back = (dir_ / "back").string();
  run_convert({.input = hf.string(), .output = ckpt});
  run_convert({.input = ckpt, .output = back, .max_shard_bytes = 1 << 20});
  EXPECT_EQ(json::parse(std::ifstream(fs::path(back) / "config.json"))["num_nextn_predict_layers"],
            1);
  HfFolder a(hf.string()), b(back);
  EXPECT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    const HfFolder::Entry& x = *a.find(n);
    const HfFolder::Entry* y = b.find(n);
    ASSERT_NE(y, nullptr) << n;
    ASSERT_EQ(x.tensor->nbytes(), y->tensor->nbytes()) << n;
    std::vector<char> u(size_t(x.tensor->nbytes())), v(u.size());
    x.file->read(*x.tensor, u.data(), u.size());
    y->file->read(*y->tensor, v.data(), v.size());
    EXPECT_EQ(u, v) << n;
  }
}

}  // namespace
}  // namespace meshtrain
