// TensorBoard event files: Event protobufs (tensorboard_event.proto) in TFRecord framing
// (uint64 length, masked CRC-32C of the length, data, masked CRC-32C of the data). One Event per
// logged step holds every scalar of that step; the reader checks both checksums of every record.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/train/metrics.h"

namespace meshtrain {

class TensorBoardWriter {
 public:
  // Creates `folder` and one events.out.tfevents.<time>.<host>.<pid> file in it, starting with the
  // file-version event. IoError naming the folder when it cannot be created or written.
  explicit TensorBoardWriter(const std::string& folder);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with a scalar per tag; flushed, so TensorBoard sees it at once.
  void add_scalars(int64_t step, const std::map<std::string, double>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// The scalars of a training step, under torchtitan's TensorBoard tags ("loss_metrics/
// global_avg_loss", "grad_norm", "lr", "throughput(tps)", "tflops", "mfu(%)" when the device has
// a known peak, "memory/max_active(GiB)", ...; expert load as "moe/layers.<i>/load_max").
std::map<std::string, double> tensorboard_scalars(const StepMetrics& m);

// <dump_folder>/<save_tb_folder>/<YYYYmmdd-HHMM>[/rank_<r>], as torchtitan lays it out.
std::string tensorboard_folder(const std::string& dump_folder, const std::string& save_tb_folder,
                               const std::string& timestamp, int rank, bool per_rank);

// Reading back (tests, tools): every event of a file in order. DataError naming the file and the
// record's byte offset on a truncated record or a checksum that does not match.
struct TensorBoardEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;              // set on the first event only
  std::map<std::string, float> scalars;  // tag -> simple_value
};
std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path);

// TFRecord's checksum: CRC-32C of `n` bytes, rotated and offset (masked) as TFRecord stores it.
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace meshtrain
