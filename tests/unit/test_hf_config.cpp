// config.json against meshtrain's models (the published DeepSeek-V3, DeepSeek-V2-Lite and Llama
// configs against the flavors: what differs, said precisely), the errors of folders that do not
// fit (architecture, missing/extra tensor, shape, dtype, config), and fp8 block dequantisation
// of a whole load against a float64 reference with partial edge blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/checkpoint/hf_io.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kDeepSeekV3 = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
  "quant_method": "fp8", "weight_block_size": [128, 128]}, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})";

const char* kDeepSeekV2Lite = R"({"architectures": ["DeepseekV2ForCausalLM"],
  "attention_bias": false, "aux_loss_alpha": 0.001, "first_k_dense_replace": 1,
  "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
  "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1,
  "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
  "type": "yarn"}, "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
  "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 102400})";

const char* kLlama31_8B = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

std::unique_ptr<Model> flavor(const std::string& name, const std::string& f) {
  ModelOptions o;
  o.name = name;
  o.flavor = f;
  o.tokenizer_vocab = 258;
  return create_model(o);
}

HfConfigCheck check(const char* text, const Model& m, int64_t seq_len) {
  return check_hf_config(parse_hf_config(json::parse(text), "config.json"), m, seq_len,
                         DType::kF32);
}

std::string joined(const std::vector<std::string>& v) {
  return fmt::format("{}", fmt::join(v, " | "));
}

TEST(HfConfig, DeepSeekV3ReleaseIsThe671BFlavorUpToEpsAndTheYarnRule) {
  auto m = flavor("deepseek_v3", "671B");
  HfConfigCheck c = check(kDeepSeekV3, *m, 4096);
  EXPECT_TRUE(c.errors.empty()) << joined(c.errors);
  const std::string notes = joined(c.notes);
  EXPECT_CONTAINS(notes, "rms_norm_eps: config.json 1e-06, meshtrain 1e-05");
  EXPECT_CONTAINS(notes, "final norm eps: config.json 1e-06, meshtrain 1.1920928955078125e-07");
  EXPECT_CONTAINS(notes, "rope_scaling: config.json yarn factor 40");
  EXPECT_CONTAINS(notes, "only when seq_len 4096 > original_seq_len 4096");
  EXPECT_CONTAINS(notes,
                  "1 MTP layer (num_nextn_predict_layers = 1) was not loaded: [model] mtp_layers = "
                  "0 (set [model] mtp_layers = 1 to load and train them)");
  // Beyond 4096 the flavor applies YaRN too, with the release's parameters.
  EXPECT_TRUE(check(kDeepSeekV3, *m, 8192).errors.empty());
  HfModelConfig h = parse_hf_config(json::parse(kDeepSeekV3), "config.json");
  EXPECT_EQ(h.fp8_block_rows, 128);
  EXPECT_EQ(h.deepseek.moe.num_expert_groups, 8);
  EXPECT_EQ(h.deepseek.moe.num_limited_groups, 4);
}

TEST(HfConfig, DeepSeekV2LiteIsThe16BFlavorButForItsYarnMscale) {
  auto m = flavor("deepseek_v3", "16B");
  EXPECT_TRUE(check(kDeepSeekV2Lite, *m, 4096).errors.empty())
      << joined(check(kDeepSeekV2Lite, *m, 4096).errors);
  // Where YaRN applies, torchtitan's 16B mscale (0.70) is not the release's 0.707.
  HfConfigCheck c = check(kDeepSeekV2Lite, *m, 8192);
  ASSERT_EQ(c.errors.size(), 1u) << joined(c.errors);
  EXPECT_CONTAINS(c.errors[0], "mscale 0.707, meshtrain yarn factor 40");
  EXPECT_CONTAINS(c.errors[0], "mscale 0.7");
  EXPECT_EQ(parse_hf_config(json::parse(kDeepSeekV2Lite), "c").deepseek.moe.num_expert_groups, 0);
}

TEST(HfConfig, Llama31MatchesThe8BFlavorAndLlama3WithoutScalingDoesNot) {
  auto m = flavor("llama3", "8B");
  HfConfigCheck c = check(kLlama31_8B, *m, 8192);
  EXPECT_TRUE(c.errors.empty() && c.notes.empty()) << joined(c.errors) << joined(c.notes);
  json j = json::parse(kLlama31_8B);
  j["rope_scaling"] = nullptr;  // Meta-Llama-3-8B
  HfConfigCheck d = check_hf_config(parse_hf_config(j, "c"), *m, 8192, DType::kF32);
  ASSERT_EQ(d.errors.size(), 1u);
  EXPECT_CONTAINS(d.errors[0], "rope_scaling: config.json none, meshtrain llama3 factor 8");
}

TEST(HfConfig, ConfigsMeshtrainCannotComputeNameTheField) {
  auto bad = [](const char* base, const std::function<void(json&)>& edit) {
    json j = json::parse(base);
    edit(j);
    return testing::error_message<ConfigError>([&] { parse_hf_config(j, "x/config.json"); });
  };
  EXPECT_CONTAINS(bad(kLlama31_8B, [](json& j) { j["architectures"] = {"MixtralForCausalLM"}; }),
                  "architectures [\"MixtralForCausalLM\"] is not supported");
  EXPECT_CONTAINS(bad(kDeepSeekV2Lite,
                      [](json& j) {
                        j["topk_method"] = "group_limited_greedy";
                        j["n_group"] = 8;
                        j["topk_group"] = 3;
                      }),
                  "topk_method = \"group_limited_greedy\"");
  EXPECT_CONTAINS(bad(kDeepSeekV3, [](json& j) { j["rope_scaling"]["mscale"] = 0.8; }),
                  "needs mscale == mscale_all_dim (found 0.8 and 1)");
  EXPECT_CONTAINS(bad(kLlama31_8B, [](json& j) { j["hidden_act"] = "gelu"; }),
                  "hidden_act = \"gelu\"");
  EXPECT_CONTAINS(bad(kDeepSeekV3, [](json& j) { j["num_hidden_layers"] = "61"; }),
                  "num_hidden_layers must be an integer, found \"61\"");
}

// An HF folder written from the tiny llama, then edited per test.
class HfFolderErrors : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    cfg_ = testing::tiny_job();
    sg_ = build_step_graph(cfg_, nullptr, {.tokenizer_vocab = 258});
    backend_ = create_backend("cpu", 0);
    store_ = std::make_unique<ParamStore>(*sg_->plan, *backend_);
    store_->initialize(3);
    folder_ = (dir_ / "hf").string();
    save_hf_from_store(folder_, ctx(), {});
  }
  HfRunContext ctx() {
    return {*sg_->model, *sg_->plan, *store_, *backend_, 32, DType::kF32, 0, {}};
  }
  json read(const std::string& name) {
    return json::parse(std::ifstream(fs::path(folder_) / name));
  }
  void put(const std::string& name, const json& j) {
    std::ofstream(fs::path(folder_) / name) << j.dump();
  }
  // Adds extra.safetensors holding one tensor and points the index at it.
  void add_tensor(const std::string& name, FileDType dt, std::vector<int64_t> shape) {
    SafetensorsWriter w((fs::path(folder_) / "extra.safetensors").string());
    w.add(name, dt, shape);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<char> zeros(size_t(n) * file_dtype_size(dt), 0);
    w.write(zeros.data(), zeros.size());
    w.finish();
    json idx = read("model.safetensors.index.json");
    idx["weight_map"][name] = "extra.safetensors";
    put("model.safetensors.index.json", idx);
  }
  std::string load_error() {
    try {
      load_hf_into_store(folder_, ctx());
    } catch (const Error& e) {
      return e.message();
    }
    ADD_FAILURE() << "the load succeeded";
    return "";
  }
  JobConfig cfg_;
  std::unique_ptr<StepGraph> sg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ParamStore> store_;
  std::string folder_;
};

TEST_F(HfFolderErrors, UnsupportedArchitectureIsNamed) {
  json c = read("config.json");
  c["architectures"] = {"Qwen2MoeForCausalLM"};
  put("config.json", c);
  EXPECT_CONTAINS(load_error(), "architectures [\"Qwen2MoeForCausalLM\"] is not supported");
}

TEST_F(HfFolderErrors, MissingTensorIsNamed) {
  json idx = read("model.safetensors.index.json");
  idx["weight_map"].erase("model.layers.1.mlp.down_proj.weight");
  put("model.safetensors.index.json", idx);
  EXPECT_CONTAINS(load_error(),
                  "tensor model.layers.1.mlp.down_proj.weight (meshtrain's "
                  "layers.1.feed_forward.w2.weight) is missing");
}

TEST_F(HfFolderErrors, ExtraTensorIsNamed) {
  add_tensor("model.layers.0.self_attn.q_norm.weight", FileDType::kF32, {10});
  EXPECT_CONTAINS(load_error(),
                  "tensor model.layers.0.self_attn.q_norm.weight has no counterpart in meshtrain's "
                  "llama3 model");
}

TEST_F(HfFolderErrors, ShapeMismatchNamesBothShapes) {
  add_tensor("model.norm.weight", FileDType::kF32, {7});
  EXPECT_CONTAINS(load_error(),
                  "tensor model.norm.weight has shape [7], meshtrain's norm.weight needs [40]");
}

TEST_F(HfFolderErrors, DtypeItCannotConvertIsNamed) {
  add_tensor("model.norm.weight", FileDType::kI32, {40});
  EXPECT_CONTAINS(load_error(),
                  "tensor model.norm.weight has dtype I32, which cannot be "
                  "converted to meshtrain's float32");
}

TEST_F(HfFolderErrors, ConfigOfAnotherModelNamesTheField) {
  json c = read("config.json");
  c["num_attention_heads"] = 8;
  c["head_dim"] = 5;
  put("config.json", c);
  EXPECT_CONTAINS(load_error(), "num_attention_heads: config.json 8, meshtrain 4");
}

TEST_F(HfFolderErrors, CorruptIndexNamesTheShard) {
  json idx = read("model.safetensors.index.json");
  idx["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
  put("model.safetensors.index.json", idx);
  EXPECT_CONTAINS(load_error(),
                  "the index names shard model-00009-of-00009.safetensors (for "
                  "model.norm.weight), which is missing");
}

// fp8 e4m3fn from its definition: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities.
double e4m3_reference(uint8_t x) {
  const int e = (x >> 3) & 15, m = x & 7;
  const double v = e == 0 ? m * std::pow(2.0, -9) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return (x & 0x80) ? -v : v;
}

TEST(HfFp8, KnownCodesDecode) {
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0xc4), -3.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) {
      EXPECT_EQ(double(e4m3_to_float(uint8_t(c))), e4m3_reference(uint8_t(c)));
    }
}

TEST_F(HfFolderErrors, Fp8BlockQuantisedWeightsDequantiseAgainstAFloat64Reference) {
  // Re-store every matrix of the folder as e4m3 codes with a float32 scale per 16x16 block (the
  // tiny model's 40, 112 and 258 leave partial edge blocks), like DeepSeek-V3's release.
  const int64_t B = 16;
  const std::string single = (dir_ / "fp8").string();
  fs::create_directories(single);
  json c = read("config.json");
  c["quantization_config"] = {
      {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {B, B}}};
  std::ofstream(fs::path(single) / "config.json") << c.dump();
  HfFolder src(folder_);
  SafetensorsWriter w((fs::path(single) / "model.safetensors").string());
  std::map<std::string, std::vector<uint8_t>> codes;
  std::map<std::string, std::vector<float>> scales;
  std::vector<std::string> order;
  std::mt19937_64 rng(5);
  for (const std::string& n : src.names()) {
    const SafetensorsEntry& e = *src.find(n)->tensor;
    order.push_back(n);
    if (e.shape.size() != 2) {
      w.add(n, e.dtype, e.shape);
      continue;
    }
    const int64_t R = e.shape[0], C = e.shape[1], sr = (R + B - 1) / B, sc = (C + B - 1) / B;
    auto& q = codes[n];
    q.resize(size_t(R * C));
    for (auto& v : q) {  // any finite code, either sign
      do v = uint8_t(rng());
      while ((v & 0x7f) == 0x7f);
    }
    auto& s = scales[n];
    s.resize(size_t(sr * sc));
    for (auto& v : s) v = std::ldexp(float(rng() % 1000 + 1), -16);
    w.add(n, FileDType::kF8E4M3, e.shape);
    w.add(n + "_scale_inv", FileDType::kF32, {sr, sc});
  }
  for (const std::string& n : order) {
    const HfFolder::Entry& e = *src.find(n);
    if (codes.count(n)) {
      w.write(codes[n].data(), codes[n].size());
      w.write(scales[n].data(), scales[n].size() * 4);
    } else {
      std::vector<std::byte> raw(size_t(e.tensor->nbytes()));
      e.file->read(*e.tensor, raw.data(), raw.size());
      w.write(raw.data(), raw.size());
    }
  }
  w.finish();
  load_hf_into_store(single, ctx());
  HfLayout layout(*sg_->model, sg_->plan->params());
  int checked = 0;
  for (const auto& [n, q] : codes) {
    const HfTensor* t = layout.find(n);
    const Tensor m = store_->master(t->param);
    const int64_t C = t->shape[1], sc = (C + B - 1) / B;
    for (int64_t hr = 0; hr < t->shape[0]; ++hr)
      for (int64_t col = 0; col < C; ++col) {
        const double want = e4m3_reference(q[size_t(hr * C + col)]) *
                            double(scales.at(n)[size_t((hr / B) * sc + col / B)]);
        // meshtrain row of HF row hr: invert the q/k permutation by search (tiny tensors).
        int64_t mr = hr;
        if (t->rope_heads > 0)
          for (int64_t r = 0; r < t->shape[0]; ++r)
            if (layout.locate(t->param, 0, r).row == hr) mr = r;
        ASSERT_EQ(m.data<float>()[mr * C + col], float(want))
            << n << " [" << hr << ", " << col << "]";
        ++checked;
      }
  }
  EXPECT_GT(checked, 40000);
  EXPECT_CONTAINS(testing::error_message<ValueError>([&] {
                    fs::remove(fs::path(single) / "model.safetensors");
                    SafetensorsWriter v((fs::path(single) / "model.safetensors").string());
                    for (const std::string& n : order) {
                      const SafetensorsEntry& e = *src.find(n)->tensor;
                      v.add(n, codes.count(n) ? FileDType::kF8E4M3 : e.dtype, e.shape);
                    }
                    for (const std::string& n : order) {
                      const SafetensorsEntry& e = *src.find(n)->tensor;
                      std::vector<char> z(
                          size_t(e.numel()) * (codes.count(n) ? 1 : file_dtype_size(e.dtype)), 0);
                      v.write(z.data(), z.size());
                    }
                    v.finish();
                    load_hf_into_store(single, ctx());
                  }),
                  "is F8_E4M3 but");
}

}  // namespace
}  // namespace meshtrain
