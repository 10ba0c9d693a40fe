// Metrics formatting (the torchtitan line) and the JSONL sink.
#include "meshtrain/train/metrics.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"
#include "meshtrain/core/logging.h"
#include "meshtrain/train/tensorboard.h"

namespace meshtrain {

MetricsLogger::MetricsLogger(const std::string& jsonl_path) : path_(jsonl_path) {
  if (path_.empty()) return;
  std::filesystem::path p(path_);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  file_ = std::fopen(path_.c_str(), "a");
  MT_CHECK_T(IoError, file_ != nullptr, "cannot open metrics file '{}' for appending", path_);
}

MetricsLogger::~MetricsLogger() {
  if (file_) std::fclose(file_);
}

void MetricsLogger::set_tensorboard(std::unique_ptr<TensorBoardWriter> tb) { tb_ = std::move(tb); }

namespace {
std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// "  mtp_loss_1:  4.5678  mtp_loss_2:  4.9012" ("" without MTP).
std::string mtp_columns(const std::vector<double>& losses) {
  std::string out;
  for (size_t k = 0; k < losses.size(); ++k)
    out += fmt::format("  mtp_loss_{}: {:7.4f}", k + 1, losses[k]);
  return out;
}
}  // namespace

std::string MetricsLogger::format_line(const StepMetrics& m) {
  std::string mfu = m.mfu < 0 ? "n/a" : fmt::format("{:.2f}%", m.mfu);
  return fmt::format(
      "step: {:>2}  loss: {:7.4f}{}  grad_norm: {:7.4f}  memory: {:5.2f}GiB({:.2f}%)  tps: {}  "
      "tflops: {:.2f}  mfu: {}{}",
      m.step, m.loss, mtp_columns(m.mtp_losses), m.grad_norm, m.memory_gib, m.memory_pct,
      with_commas(int64_t(m.tps + 0.5)), m.tflops, mfu,
      m.summary_suffix.empty() ? "" : "  " + m.summary_suffix);
}

std::string MetricsLogger::format_validation_line(const ValidationMetrics& v) {
  return fmt::format(
      "validate step: {:>2}  loss: {:7.4f}{}  memory: {:5.2f}GiB  tps: {}  ({} batches)", v.step,
      v.loss, mtp_columns(v.mtp_losses), v.memory_gib, with_commas(int64_t(v.tps + 0.5)),
      v.batches);
}

void MetricsLogger::write_json(const std::string& line) {
  if (!file_) return;
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

void MetricsLogger::log_validation(const ValidationMetrics& v) {
  log_info("{}", format_validation_line(v));
  if (tb_) {
    std::map<std::string, double> scalars = {
        {"validation_metrics/loss", v.loss},
        {"validation_metrics/throughput(tps)", v.tps},
        {"validation_metrics/memory/max_active(GiB)", v.memory_gib}};
    for (size_t k = 0; k < v.mtp_losses.size(); ++k)
      scalars[fmt::format("validation_metrics/mtp_loss_{}", k + 1)] = v.mtp_losses[k];
    tb_->add_scalars(v.step, scalars);
  }
  nlohmann::json j;
  j["step"] = v.step;
  j["validation_loss"] = v.loss;
  for (size_t k = 0; k < v.mtp_losses.size(); ++k)
    j[fmt::format("validation_mtp_loss_{}", k + 1)] = v.mtp_losses[k];
  j["validation_tps"] = v.tps;
  j["validation_batches"] = v.batches;
  write_json(j.dump() + "\n");
}

void MetricsLogger::log(const StepMetrics& m) {
  log_info("{}", format_line(m));
  if (tb_) tb_->add_scalars(m.step, tensorboard_scalars(m));
  if (!file_) return;
  nlohmann::json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  if (!m.mtp_losses.empty()) {
    for (size_t k = 0; k < m.mtp_losses.size(); ++k)
      j[fmt::format("mtp_loss_{}", k + 1)] = m.mtp_losses[k];
    j["total_loss"] = m.total_loss;
    j["mtp_loss_weight"] = m.mtp_loss_weight;
  }
  j["grad_norm"] = m.grad_norm;
  j["lr"] = m.lr;
  j["tps"] = m.tps;
  j["tflops"] = m.tflops;
  j["mfu"] = m.mfu < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.mfu);
  j["memory_gib"] = m.memory_gib;
  j["step_time_s"] = m.step_time_s;
  for (const auto& [k, v] : m.extra) j[k] = v;
  // nlohmann prints doubles with the shortest representation that round-trips (full precision).
  write_json(j.dump() + "\n");
}

}  // namespace meshtrain
