// convert: direction and model resolution, then checkpoint/hf_convert with a progress meter
// (rate over the whole run so far, time left at that rate).
#include "meshtrain/train/convert.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "meshtrain/checkpoint/hf_checkpoint.h"
#include "meshtrain/checkpoint/hf_convert.h"
#include "meshtrain/checkpoint/load.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

class ProgressMeter {
 public:
  explicit ProgressMeter(std::string what) : what_(std::move(what)), tty_(isatty(fileno(stdout))) {}
  void operator()(const HfProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    const bool done = p.bytes_done >= p.bytes && p.tensors_done >= p.tensors;
    if (!done && since < (tty_ ? 0.2 : 5.0)) return;
    last_ = now;
    const double t = std::chrono::duration<double>(now - start_).count();
    const double rate = t > 0 ? double(p.bytes_done) / t : 0;
    const double left = rate > 0 ? double(p.bytes - p.bytes_done) / rate : 0;
    std::string line =
        fmt::format("{}: {:5.1f}%  {:.2f} / {:.2f} GB  {:.0f} MB/s  {:.0f} s left  tensor {} of {}",
                    what_, p.bytes ? 100.0 * double(p.bytes_done) / double(p.bytes) : 100.0,
                    double(p.bytes_done) / 1e9, double(p.bytes) / 1e9, rate / 1e6, left,
                    p.tensors_done, p.tensors);
    if (tty_)
      std::printf("\r%s   %s", line.c_str(), done ? "\n" : "");
    else
      std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  std::string what_;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
};

// The one-rank plan of a config (the model's parameter list; the graph is built, nothing is
// allocated for the weights).
// The compute dtype is the training run's (it sets the final norm's eps that config.json records):
// [training] mixed_precision_param, or for "auto" the recorded device's default (cpu when "auto").
std::unique_ptr<StepGraph> graph_of(JobConfig cfg) {
  cfg.training.local_batch_size = 1;
  const DeviceType device =
      cfg.job.device == DeviceChoice::kCuda ? DeviceType::kCUDA : DeviceType::kCPU;
  return build_step_graph(
      cfg, nullptr,
      {.tokenizer_vocab = 1,
       .compute_dtype = resolve_compute_dtype(cfg.training.mixed_precision_param, device)});
}

}  // namespace

void run_convert(const ConvertRequest& r) {
  MT_CHECK_T(ConfigError, !r.input.empty() && !r.output.empty(),
             "convert needs --input PATH and --output PATH");
  MT_CHECK_T(ConfigError, fs::is_directory(r.input), "convert: input {} is not a folder", r.input);
  const std::string out = fs::absolute(r.output).lexically_normal().string();
  ConvertOptions o{.dtype = export_file_dtype(r.dtype), .max_shard_bytes = r.max_shard_bytes};
  const auto t0 = std::chrono::steady_clock::now();
  if (fs::exists(fs::path(r.input) / "index.json")) {
    const CheckpointIndex ix = read_checkpoint_index(r.input);
    JobConfig cfg = job_config_from_values(load_config_string(
        job_config_schema(), ix.config_toml, r.input + "/index.json (config)", r.overrides));
    // The vocabulary the checkpoint was trained with (the tokenizer's, when the config says 0).
    if (const StoredTensor* e = ix.find("tok_embeddings.weight"))
      cfg.model.vocab_size = e->shape[0];
    auto sg = graph_of(cfg);
    std::printf("convert: meshtrain checkpoint %s (step %lld) -> HF folder %s as %s\n  model: %s\n",
                r.input.c_str(), (long long)ix.step, out.c_str(), r.dtype.c_str(),
                sg->model->describe().c_str());
    ProgressMeter meter("to HF");
    o.progress = [&](const HfProgress& p) { meter(p); };
    convert_checkpoint_to_hf(r.input, ix, *sg->model, *sg->plan, cfg.training.seq_len,
                             sg->plan->config().compute_dtype, out, o);
  } else if (fs::exists(fs::path(r.input) / "config.json")) {
    const HfModelConfig hf = read_hf_config(r.input);
    std::vector<std::string> ov = r.overrides;
    if (r.config.empty()) {  // the model is the one config.json describes, MTP layers included
      ov.insert(ov.begin(), {"--model.name", hf.model_name, "--model.hf_config",
                             fs::absolute(r.input).string()});
      if (hf.mtp_layers > 0)
        ov.insert(ov.begin() + 4, {"--model.mtp_layers", std::to_string(hf.mtp_layers)});
    }
    JobConfig cfg = parse_job_config(r.config, ov);
    if (cfg.model.vocab_size == 0)
      cfg.model.vocab_size =
          hf.model_name == "llama3" ? hf.llama.vocab_size : hf.deepseek.vocab_size;
    auto sg = graph_of(cfg);
    std::printf("convert: HF folder %s -> meshtrain checkpoint %s as %s\n  model: %s\n",
                r.input.c_str(), out.c_str(), r.dtype.c_str(), sg->model->describe().c_str());
    ProgressMeter meter("to meshtrain");
    o.progress = [&](const HfProgress& p) { meter(p); };
    convert_hf_to_checkpoint(r.input, *sg->model, *sg->plan, cfg.training.seq_len,
                             sg->plan->config().compute_dtype, job_config_to_values(cfg).to_toml(),
                             out, o);
  } else {
    MT_THROW(ConfigError,
             "convert: {} is neither a meshtrain checkpoint (no index.json) nor a Hugging Face "
             "folder (no config.json)",
             r.input);
  }
  std::printf("convert: wrote %s in %.1f s\n", out.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace meshtrain
