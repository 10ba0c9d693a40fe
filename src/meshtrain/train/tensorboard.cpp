// TensorBoard writer and reader: protobuf (Debian's libprotobuf) encodes the events, ISA-L's
// CRC-32C (crc32_iscsi) checksums the TFRecord framing; nothing here encodes bytes by hand
// beyond the little-endian length and checksum words the framing defines.
#include "meshtrain/train/tensorboard.h"

#include <fmt/format.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/check.h"
#include "meshtrain/train/tensorboard_event.pb.h"

namespace meshtrain {
namespace fs = std::filesystem;

uint32_t masked_crc32c(const void* data, size_t n) {
  // crc32_iscsi keeps the running (inverted) register: start at ~0 and invert at the end.
  const uint32_t crc =
      ~crc32_iscsi(static_cast<unsigned char*>(const_cast<void*>(data)), int(n), 0xFFFFFFFFu);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += char((v >> (8 * i)) & 0xff);
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& folder) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  MT_CHECK_T(IoError, !ec && fs::is_directory(folder),
             "[metrics] save_tb_folder: cannot create the TensorBoard folder '{}': {}", folder,
             ec ? ec.message() : "a file of that name is in the way");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (fs::path(folder) / fmt::format("events.out.tfevents.{}.{}.{}", int64_t(now_seconds()),
                                          host, int64_t(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  MT_CHECK_T(IoError, file_ != nullptr,
             "[metrics] save_tb_folder: cannot write TensorBoard events in '{}': {}", folder,
             std::strerror(errno));
  tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  write_record(e.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  put_le(rec, data.size(), 8);
  put_le(rec, masked_crc32c(rec.data(), 8), 4);
  rec += data;
  put_le(rec, masked_crc32c(data.data(), data.size()), 4);
  const bool ok =
      std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size() && std::fflush(file_) == 0;
  MT_CHECK_T(IoError, ok, "cannot append to TensorBoard file '{}': {}", path_,
             std::strerror(errno));
}

void TensorBoardWriter::add_scalars(int64_t step, const std::map<std::string, double>& scalars) {
  tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  tb::Summary* s = e.mutable_summary();
  for (const auto& [tag, v] : scalars) {
    tb::SummaryValue* value = s->add_value();
    value->set_tag(tag);
    value->set_simple_value(float(v));
  }
  write_record(e.SerializeAsString());
}

std::map<std::string, double> tensorboard_scalars(const StepMetrics& m) {
  std::map<std::string, double> s = {
      {"loss_metrics/global_avg_loss", m.loss},
      {"grad_norm", m.grad_norm},
      {"lr", m.lr},
      {"throughput(tps)", m.tps},
      {"tflops", m.tflops},
      {"memory/max_active(GiB)", m.memory_gib},
      {"memory/max_active(%)", m.memory_pct},
      {"time_metrics/end_to_end(s)", m.step_time_s},
  };
  if (m.mfu >= 0) s["mfu(%)"] = m.mfu;
  if (!m.mtp_losses.empty()) {
    for (size_t k = 0; k < m.mtp_losses.size(); ++k)
      s[fmt::format("loss_metrics/mtp_loss_{}", k + 1)] = m.mtp_losses[k];
    s["loss_metrics/total_loss"] = m.total_loss;
    s["loss_metrics/mtp_loss_weight"] = m.mtp_loss_weight;
  }
  // "moe.layers.3.load_max" -> "moe/layers.3/load_max"; "moe.imbalance_avg" -> "moe/imbalance_avg"
  for (const auto& [key, v] : m.extra) {
    std::string tag = key;
    if (tag.rfind("moe.", 0) == 0) {
      tag = "moe/" + tag.substr(4);
      if (size_t last = tag.rfind('.'); last != std::string::npos && last > 4) tag[last] = '/';
    }
    s[tag] = v;
  }
  return s;
}

std::string tensorboard_folder(const std::string& dump_folder, const std::string& save_tb_folder,
                               const std::string& timestamp, int rank, bool per_rank) {
  fs::path p = fs::path(dump_folder) / save_tb_folder / timestamp;
  if (per_rank) p /= fmt::format("rank_{}", rank);
  return p.string();
}

std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK_T(IoError, bool(in), "cannot open TensorBoard file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::vector<TensorBoardEvent> out;
  size_t at = 0;
  while (at < bytes.size()) {
    MT_CHECK_T(DataError, bytes.size() - at >= 12,
               "TensorBoard file '{}': truncated record header at byte {}", path, at);
    const uint64_t len = get_le(p + at, 8);
    MT_CHECK_T(DataError, uint32_t(get_le(p + at + 8, 4)) == masked_crc32c(p + at, 8),
               "TensorBoard file '{}': record at byte {}: length checksum does not match", path,
               at);
    MT_CHECK_T(DataError, bytes.size() - at - 12 >= len + 4,
               "TensorBoard file '{}': record at byte {} is truncated ({} data bytes announced)",
               path, at, len);
    const unsigned char* data = p + at + 12;
    MT_CHECK_T(DataError, uint32_t(get_le(data + len, 4)) == masked_crc32c(data, len),
               "TensorBoard file '{}': record at byte {}: data checksum does not match", path, at);
    tb::Event e;
    MT_CHECK_T(DataError, e.ParseFromArray(data, int(len)),
               "TensorBoard file '{}': record at byte {} is not an Event", path, at);
    TensorBoardEvent ev;
    ev.wall_time = e.wall_time();
    ev.step = e.step();
    if (e.has_file_version()) ev.file_version = e.file_version();
    if (e.has_summary())
      for (const tb::SummaryValue& v : e.summary().value())
        if (v.has_simple_value()) ev.scalars[v.tag()] = v.simple_value();
    out.push_back(std::move(ev));
    at += 12 + len + 4;
  }
  return out;
}

}  // namespace meshtrain
