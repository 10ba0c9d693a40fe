// Per-step metrics: torchtitan's log line on rank 0 every log_freq steps, one JSON object per
// logged step appended to <dump_folder>/metrics.jsonl (full float precision, so runs compare),
// and, when enabled, the same figures as TensorBoard scalars. With multi-token prediction `loss`
// stays the next-token loss (Megatron's "lm loss"); mtp_loss_<k> and total_loss come beside it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;  // the next-token loss (with MTP: the main loss, without the MTP depths)
  // Multi-token prediction (empty without): each depth's loss, the loss training minimises
  // (loss + mtp_loss_weight · mean of mtp_losses) and the step's weight.
  std::vector<double> mtp_losses;
  double total_loss = 0;
  double mtp_loss_weight = 0;
  double grad_norm = 0;
  double lr = 0;
  double tps = 0;         // tokens per second per device
  double tflops = 0;      // achieved TFLOP/s per device
  double mfu = -1;        // percent of peak; < 0 when the device has no known peak
  double memory_gib = 0;  // peak device memory in use
  double memory_pct = 0;  // of the device's capacity
  double step_time_s = 0;
  // Extra named figures (expert load per layer, ...), written to the JSON line.
  std::map<std::string, double> extra;
  std::string summary_suffix;  // appended to the log line (e.g. a one-line expert-load summary)
};

// A validation pass: the mean token loss over its batches, and its throughput.
struct ValidationMetrics {
  int64_t step = 0;
  double loss = 0;                 // the next-token loss
  std::vector<double> mtp_losses;  // each MTP depth's (empty without MTP)
  double tps = 0;                  // tokens per second per device
  int64_t batches = 0;
  double memory_gib = 0;
};

class TensorBoardWriter;

class MetricsLogger {
 public:
  // `jsonl_path` empty: no file. Only rank 0 should construct one with a path.
  explicit MetricsLogger(const std::string& jsonl_path);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Events go to `tb` too (on every rank that has one).
  void set_tensorboard(std::unique_ptr<TensorBoardWriter> tb);
  const TensorBoardWriter* tensorboard() const { return tb_.get(); }

  void log(const StepMetrics& m);
  // "validate step:  5  loss:  4.1234  memory: ...": the line, a JSON line with validation_loss,
  // and the validation_metrics/ scalars.
  void log_validation(const ValidationMetrics& v);
  static std::string format_line(const StepMetrics& m);
  static std::string format_validation_line(const ValidationMetrics& v);
  const std::string& path() const { return path_; }

 private:
  void write_json(const std::string& line);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace meshtrain
