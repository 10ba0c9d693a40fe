// Safetensors reader/writer, file dtype conversions and the write-fault hook: a hand-built file as
// the format specifies it, round trips of every dtype, ranged reads, and every header error.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "meshtrain/checkpoint/file_dtype.h"
#include "meshtrain/checkpoint/file_io.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "test_support.h"

namespace meshtrain {
namespace {

using testing::error_message;

class SafetensorsTest : public testing::TempDirTest {
 protected:
  // A file made of an explicit header text and data bytes, as the format defines it.
  std::string raw_file(const std::string& name, const std::string& header, const std::string& data,
                       int64_t length_field = -1) {
    uint64_t n = length_field < 0 ? header.size() : uint64_t(length_field);
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return write(name, bytes + header + data);
  }
  std::string floats(std::initializer_list<float> v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), std::data(v), s.size());
    return s;
  }
};

TEST_F(SafetensorsTest, ReadsAFileBuiltByHandFromTheSpec) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  int64_t seven = 7;
  std::string data = floats({1.5f, -2.0f}) + std::string(reinterpret_cast<char*>(&seven), 8);
  SafetensorsReader r(raw_file("hand.safetensors", header, data));
  ASSERT_EQ(r.entries().size(), 2u);
  EXPECT_EQ(r.entries()[0].name, "a");  // in data order, not header order
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const SafetensorsEntry& a = r.at("a");
  EXPECT_EQ(a.dtype, FileDType::kF32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.begin, 8 + int64_t(header.size()));
  float got[2];
  r.read(a, got, sizeof(got));
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.0f);
  int64_t b = 0;
  r.read(r.at("b"), &b, 8);
  EXPECT_EQ(b, 7);
  EXPECT_EQ(r.bytes_read(), 16);
  EXPECT_EQ(r.find("c"), nullptr);
  EXPECT_CONTAINS(error_message<IoError>([&] { r.at("c"); }), "holds no tensor \"c\"");
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeWithChunkedWritesAndRangedReads) {
  const std::string path = (dir_ / "all.safetensors").string();
  struct T {
    std::string name;
    FileDType dtype;
    std::vector<int64_t> shape;
  };
  std::vector<T> ts = {{"f64", FileDType::kF64, {3}},      {"f32", FileDType::kF32, {2, 3}},
                       {"f16", FileDType::kF16, {5}},      {"bf16", FileDType::kBF16, {4, 1}},
                       {"f8", FileDType::kF8E4M3, {7}},    {"i64", FileDType::kI64, {2}},
                       {"i32", FileDType::kI32, {3}},      {"i16", FileDType::kI16, {3}},
                       {"i8", FileDType::kI8, {1}},        {"u8", FileDType::kU8, {9}},
                       {"bool", FileDType::kBool, {2, 2}}, {"empty", FileDType::kF32, {0, 4}},
                       {"scalar", FileDType::kF32, {}}};
  SafetensorsWriter w(path);
  std::vector<std::string> payload;
  uint32_t seed = 12345;
  for (const T& t : ts) {
    w.add(t.name, t.dtype, t.shape);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::string bytes(size_t(n) * file_dtype_size(t.dtype), '\0');
    for (char& c : bytes) c = char((seed = seed * 1664525u + 1013904223u) >> 24);
    payload.push_back(bytes);
  }
  w.set_metadata("step", "10");
  std::string all;
  for (const std::string& p : payload) all += p;
  // Chunks that cut across tensor boundaries.
  for (size_t at = 0; at < all.size(); at += 5)
    w.write(all.data() + at, std::min<size_t>(5, all.size() - at));
  SafetensorsWritten out = w.finish();
  EXPECT_EQ(out.bytes, int64_t(std::filesystem::file_size(path)));
  int64_t size = 0;
  EXPECT_EQ(out.crc32, file_crc32(path, &size));
  EXPECT_EQ(size, out.bytes);

  SafetensorsReader r(path);
  EXPECT_EQ(r.data_begin() % 8, 0);
  EXPECT_EQ(r.metadata().at("step"), "10");
  ASSERT_EQ(r.entries().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const SafetensorsEntry& e = r.at(ts[i].name);
    EXPECT_EQ(e.dtype, ts[i].dtype) << ts[i].name;
    EXPECT_EQ(e.shape, ts[i].shape) << ts[i].name;
    EXPECT_EQ(e.begin, w.entries()[i].begin) << ts[i].name;
    std::string got(size_t(e.nbytes()), '\0');
    r.read(e, got.data(), got.size());
    EXPECT_EQ(got, payload[i]) << ts[i].name;
  }
  // A byte range of one tensor touches only those bytes.
  const SafetensorsEntry& f32 = r.at("f32");
  const int64_t before = r.bytes_read();
  float mid[2];
  r.read_range(f32, 8, 8, mid);
  EXPECT_EQ(std::memcmp(mid, payload[1].data() + 8, 8), 0);
  EXPECT_EQ(r.bytes_read() - before, 8);
  EXPECT_CONTAINS(error_message<IoError>([&] { r.read_range(f32, 20, 8, mid); }),
                  "bytes [20, 28) asked of tensor \"f32\", which has 24");
}

TEST_F(SafetensorsTest, ChecksumIsZlibCrc32) {
  EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32_hex(0xCBF43926u), "0xcbf43926");
}

TEST_F(SafetensorsTest, HeaderErrorsNameTheFileAndTheTensor) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data = floats({1, 2, 3, 4});
  auto err = [&](const std::string& name, const std::string& header, const std::string& d,
                 int64_t length_field = -1) {
    std::string p = raw_file(name, header, d, length_field);
    return error_message<IoError>([&] { SafetensorsReader r(p); });
  };
  std::string m = error_message<IoError>([&] { SafetensorsReader r((dir_ / "none").string()); });
  EXPECT_CONTAINS(m, "cannot open");
  EXPECT_CONTAINS(m, "none");
  EXPECT_CONTAINS(error_message<IoError>([&] { SafetensorsReader r(write("short", "abc")); }),
                  "short is truncated: 3 bytes");
  EXPECT_CONTAINS(err("huge", "{}", "", int64_t(1) << 40), "more than the 100000000 byte limit");
  EXPECT_CONTAINS(err("cut_header", "{" + ok_a + "}", "", 500),
                  "cut_header is truncated: the header needs 500 bytes");
  EXPECT_CONTAINS(err("json", "{\"a\":", data), "json: the header is not valid JSON");
  EXPECT_CONTAINS(err("notobj", "[1,2]", ""), "the header must be a JSON object");
  m = err("dtype", R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}})", floats({1, 2}));
  EXPECT_CONTAINS(m, "dtype: tensor \"w\": unknown dtype \"F4\"");
  EXPECT_CONTAINS(
      err("shape", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", floats({1, 2})),
      "tensor \"w\": shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8");
  EXPECT_CONTAINS(err("trunc_data", "{" + ok_a + "}", floats({1})),
                  "tensor \"a\": data_offsets [0, 8] end past the data region of 4 bytes");
  EXPECT_CONTAINS(
      err("overlap", "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          data.substr(0, 12)),
      "tensors \"a\" and \"b\" overlap");
  EXPECT_CONTAINS(
      err("hole", "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", data),
      "data bytes [8, 12) belong to no tensor");
  EXPECT_CONTAINS(err("extra", "{" + ok_a + "}", data), "extra bytes after the last tensor");
  EXPECT_CONTAINS(err("offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", ""),
                  "\"data_offsets\" must be an array [begin, end]");
  EXPECT_CONTAINS(err("meta", R"({"__metadata__":{"k":3}})", ""),
                  "__metadata__ value of \"k\" must be a string");
}

TEST_F(SafetensorsTest, WriterNeverReplacesAFileAndNamesItOnAFullDisk) {
  const std::string existing = write("exists.safetensors", "x");
  SafetensorsWriter w(existing);
  w.add("a", FileDType::kF32, {2});
  EXPECT_CONTAINS(error_message<IoError>([&] { w.write("12345678", 8); }),
                  "cannot create " + existing + ": File exists");
  EXPECT_EQ(std::filesystem::file_size(existing), 1u);

  // The 3rd write call (length, header, then data) runs out of space: half of it is written.
  set_write_fault(parse_write_fault("enospc@3"), 0);
  const std::string path = (dir_ / "full.safetensors").string();
  SafetensorsWriter f(path);
  f.add("a", FileDType::kF32, {4});
  std::string m = error_message<IoError>([&] { f.write(floats({1, 2, 3, 4}).data(), 16); });
  set_write_fault({}, 0);
  EXPECT_CONTAINS(m, "cannot write " + path + ": No space left on device");
  EXPECT_THROW(SafetensorsReader r(path), IoError);  // the partial file does not read as whole
}

TEST(WriteFault, ParsesTheEnvironmentSyntax) {
  WriteFault f = parse_write_fault("kill@12:rank=3");
  EXPECT_EQ(f.kind, WriteFault::Kind::kKill);
  EXPECT_EQ(f.at_write, 12);
  EXPECT_EQ(f.rank, 3);
  f = parse_write_fault("enospc@1");
  EXPECT_EQ(f.kind, WriteFault::Kind::kNoSpace);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(parse_write_fault("eio@4:rank=0").kind, WriteFault::Kind::kIoError);
  EXPECT_EQ(parse_write_fault("").kind, WriteFault::Kind::kNone);
  for (const char* bad : {"enospc", "kill@0", "crash@3", "kill@2:r=1", "kill@x"})
    EXPECT_CONTAINS(error_message<ConfigError>([&] { parse_write_fault(bad); }),
                    "MESHTRAIN_CHECKPOINT_FAULT must be");
}

TEST(FileDType, NamesSizesAndExactTypes) {
  EXPECT_EQ(parse_file_dtype("F8_E4M3"), FileDType::kF8E4M3);
  EXPECT_FALSE(parse_file_dtype("f32").has_value());
  EXPECT_EQ(file_dtype_size(FileDType::kBF16), 2u);
  EXPECT_EQ(file_dtype_of(DType::kF64), FileDType::kF64);
  EXPECT_EQ(dtype_of_file(FileDType::kI32), DType::kI32);
  EXPECT_FALSE(dtype_of_file(FileDType::kF16).has_value());
}

TEST(FileDType, HalfAndFloat8Values) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                          // ties to even: inf
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even mantissa
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd -> up
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite half survives the round trip
    ASSERT_EQ(float_to_half(half_to_float(uint16_t(h))), h);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
}

TEST(FileDType, ConversionsAndTheirErrors) {
  const uint16_t halves[3] = {0x3c00, 0xc000, 0x3800};
  float f[3];
  convert_from_file(FileDType::kF16, halves, DType::kF32, f, 3, "w");
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_EQ(f[2], 0.5f);
  double d[3];
  const uint8_t e4[3] = {0x38, 0x7e, 0x01};
  convert_from_file(FileDType::kF8E4M3, e4, DType::kF64, d, 3, "w");
  EXPECT_EQ(d[1], 448.0);
  const float x[2] = {1.0f + std::ldexp(1.0f, -9), 3.0f};
  uint16_t bf[2];
  convert_to_file(DType::kF32, x, FileDType::kBF16, bf, 2, "w");
  EXPECT_EQ(bf[0], 0x3f80);  // rounds to nearest even
  EXPECT_EQ(BFloat16::to_float(bf[1]), 3.0f);
  const int64_t big[1] = {int64_t(1) << 40};
  int32_t i32[1];
  EXPECT_CONTAINS(
      error_message<ValueError>(
          [&] { convert_from_file(FileDType::kI64, big, DType::kI32, i32, 1, "counts"); }),
      "counts: element 0 of the I64 data is 1099511627776, which does not fit in int32");
  EXPECT_CONTAINS(error_message<ValueError>([&] {
                    convert_from_file(FileDType::kI32, i32, DType::kF32, f, 1, "layers.0.w");
                  }),
                  "layers.0.w: cannot convert the file's I32 data to float32");
  EXPECT_CONTAINS(error_message<ValueError>(
                      [&] { convert_to_file(DType::kF32, f, FileDType::kF8E4M3, bf, 1, "w"); }),
                  "w: cannot write float32 data as F8_E4M3");
  const uint8_t flags[2] = {0, 5};
  int64_t i64[2];
  convert_from_file(FileDType::kBool, flags, DType::kI64, i64, 2, "mask");
  EXPECT_EQ(i64[1], 1);
}

}  // namespace
}  // namespace meshtrain
