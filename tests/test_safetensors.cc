// Tests of the strict safetensors reader and the deterministic writer (tools/lib/safetensors.h).
//
// Hostile files are built byte by byte here (length field, header text, data), independently of
// the writer, so the reader is not only checked against its own output.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "ref/error.h"
#include "ref/tensor.h"
#include "tools/lib/safetensors.h"

using namespace indexshare;
using namespace indexshare::io;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

// 8-byte little-endian length `n`, then the header text, then the data buffer.
Bytes build_with_length(uint64_t n, const std::string& header, const Bytes& data = {}) {
  Bytes b;
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(n >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}
Bytes build(const std::string& header, const Bytes& data = {}) {
  return build_with_length(header.size(), header, data);
}

Bytes zeros(size_t n) { return Bytes(n, 0); }

// The message of the Error `f` throws ("" and a failed check when it throws nothing or another
// exception type).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("not an indexshare::Error: " << e.what());
    return "";
  }
  FAIL("no error thrown");
  return "";
}

constexpr const char* kName = "h.safetensors";

// Parses `file` and checks that the Error starts with the file name and contains every part.
void check_refused(const Bytes& file, const std::vector<std::string>& parts) {
  const std::string msg = error_of([&] { parse_safetensors(file.data(), file.size(), kName); });
  INFO("message: " << msg);
  CHECK(msg.rfind(std::string(kName) + ": ", 0) == 0);
  for (const std::string& p : parts) {
    INFO("expected part: " << p);
    CHECK(msg.find(p) != std::string::npos);
  }
}

SafetensorsFile parse(const Bytes& file) {
  return parse_safetensors(file.data(), file.size(), kName);
}

Bytes read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh directory under the system temp dir, removed when the test ends.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("indexshare_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

TensorView raw_view(const std::string& name, DType dtype, Shape shape, uint8_t seed) {
  TensorView v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.bytes.resize(size_t(shape_numel(v.shape)) * dtype_size(dtype));
  for (size_t i = 0; i < v.bytes.size(); ++i) v.bytes.mutable_data()[i] = uint8_t(seed + 37 * i);
  return v;
}

}  // namespace

TEST_CASE("safetensors: dtype names, sizes and parsing") {
  const std::vector<std::pair<DType, std::pair<const char*, size_t>>> all = {
      {DType::F64, {"F64", 8}},         {DType::F32, {"F32", 4}},
      {DType::F16, {"F16", 2}},         {DType::BF16, {"BF16", 2}},
      {DType::F8_E4M3, {"F8_E4M3", 1}}, {DType::F8_E5M2, {"F8_E5M2", 1}},
      {DType::I64, {"I64", 8}},         {DType::I32, {"I32", 4}},
      {DType::I16, {"I16", 2}},         {DType::I8, {"I8", 1}},
      {DType::U8, {"U8", 1}},           {DType::BOOL, {"BOOL", 1}},
  };
  for (const auto& [dt, ns] : all) {
    CHECK(dtype_name(dt) == ns.first);
    CHECK(dtype_size(dt) == ns.second);
    CHECK(parse_dtype(ns.first) == dt);
  }
  const std::string msg = error_of([] { parse_dtype("f32"); });
  CHECK(msg.find("'f32'") != std::string::npos);
}

TEST_CASE("safetensors: round trip of every dtype, rank-0 and zero-size tensors, metadata") {
  TempDir dir;
  const std::string path = (dir.path / "all.safetensors").string();
  std::vector<TensorView> in = {
      raw_view("f64", DType::F64, {2, 3}, 1),      raw_view("f32", DType::F32, {4}, 2),
      raw_view("f16", DType::F16, {1, 2, 3}, 3),   raw_view("bf16", DType::BF16, {5}, 4),
      raw_view("e4m3", DType::F8_E4M3, {3, 3}, 5), raw_view("e5m2", DType::F8_E5M2, {7}, 6),
      raw_view("i64", DType::I64, {2}, 7),         raw_view("i32", DType::I32, {2, 2}, 8),
      raw_view("i16", DType::I16, {3}, 9),         raw_view("i8", DType::I8, {4}, 10),
      raw_view("u8", DType::U8, {6}, 11),          raw_view("bool", DType::BOOL, {2}, 12),
      raw_view("scalar", DType::F32, {}, 13),      raw_view("empty", DType::F32, {0, 3}, 14),
      raw_view("empty2", DType::I64, {4, 0}, 15),  raw_view("zz_last", DType::U8, {1}, 16),
  };
  for (TensorView& v : in)
    if (v.dtype == DType::BOOL)
      for (size_t i = 0; i < v.bytes.size(); ++i) v.bytes.mutable_data()[i] &= 1;  // valid booleans
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo ✓"}};
  write_safetensors(path, in, meta);

  const SafetensorsFile f = read_safetensors(path);
  CHECK(f.source == path);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == in.size());
  // Stored in the given order, so offset order equals input order.
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("tensor " << in[i].name);
    CHECK(f.tensors[i].name == in[i].name);
    CHECK(f.tensors[i].dtype == in[i].dtype);
    CHECK(f.tensors[i].shape == in[i].shape);
    CHECK(f.tensors[i].bytes == in[i].bytes);
    REQUIRE(f.find(in[i].name) != nullptr);
    CHECK(&f.get(in[i].name) == f.find(in[i].name));
  }
  CHECK(f.find("nope") == nullptr);
  CHECK(f.get("scalar").shape.empty());
  CHECK(f.get("scalar").bytes.size() == 4);
  CHECK(f.get("empty").bytes.empty());

  // Typed tensors through make_view / as_tensor.
  Tensor<float> tf({2, 2});
  for (int i = 0; i < 4; ++i) tf[i] = 0.25f * float(i) - 1.0f;
  Tensor<double> td({3});
  td[0] = 1e300, td[1] = -0.0, td[2] = 3.5;
  Tensor<int32_t> ti({2});
  ti[0] = -7, ti[1] = 1 << 30;
  Tensor<int64_t> tl({1, 1});
  tl[0] = -(int64_t(1) << 62);
  Tensor<uint8_t> tu({3});
  tu[0] = 0, tu[1] = 128, tu[2] = 255;
  Tensor<bf16_t> tb({2});
  tb[0].bits = 0x3f80, tb[1].bits = 0xff81;
  Tensor<e4m3_t> te({2, 1});
  te[0].bits = 0x7e, te[1].bits = 0x80;
  Tensor<float> t0(Shape{});
  t0[0] = 42.0f;
  Tensor<float> tz({0});
  const std::string typed = (dir.path / "typed.safetensors").string();
  write_safetensors(typed,
                    {make_view("f", tf), make_view("d", td), make_view("i", ti), make_view("l", tl),
                     make_view("u", tu), make_view("b", tb), make_view("e", te), make_view("s", t0),
                     make_view("z", tz)},
                    {});
  const SafetensorsFile g = read_safetensors(typed);
  CHECK(g.metadata.empty());
  CHECK(as_tensor<float>(g.get("f"), typed).data == tf.data);
  CHECK(as_tensor<float>(g.get("f"), typed).shape == tf.shape);
  const Tensor<double> rd = as_tensor<double>(g.get("d"), typed);
  CHECK(rd.data == td.data);
  CHECK(std::signbit(rd[1]));
  CHECK(as_tensor<int32_t>(g.get("i"), typed).data == ti.data);
  CHECK(as_tensor<int64_t>(g.get("l"), typed).data == tl.data);
  CHECK(as_tensor<uint8_t>(g.get("u"), typed).data == tu.data);
  CHECK(as_tensor<bf16_t>(g.get("b"), typed).data == tb.data);
  CHECK(as_tensor<e4m3_t>(g.get("e"), typed).data == te.data);
  CHECK(as_tensor<e4m3_t>(g.get("e"), typed).shape == Shape{2, 1});
  CHECK(as_tensor<float>(g.get("s"), typed).shape == Shape{});
  CHECK(as_tensor<float>(g.get("s"), typed)[0] == 42.0f);
  CHECK(as_tensor<float>(g.get("z"), typed).numel() == 0);
  expect_shape(g.get("f"), {2, 2}, typed);
  const std::string msg = error_of([&] { expect_shape(g.get("f"), {4}, typed); });
  CHECK(msg.rfind(typed + ": tensor 'f': ", 0) == 0);
  CHECK(msg.find("expected shape [4], got [2,2]") != std::string::npos);
}

TEST_CASE("safetensors: the writer is deterministic, keys sorted, header padded to 8 bytes") {
  TempDir dir;
  Tensor<float> a({2});
  a[0] = 1.0f, a[1] = 2.0f;
  Tensor<uint8_t> b({3}, 9);
  // "b" first in the file, but keys are sorted in the header.
  const std::vector<TensorView> views = {make_view("b", b), make_view("a", a)};
  const std::map<std::string, std::string> meta = {{"z", "1"}, {"k", "v"}};
  const fs::path p1 = dir.path / "one.safetensors", p2 = dir.path / "two.safetensors";
  write_safetensors(p1.string(), views, meta);
  write_safetensors(p2.string(), views, meta);
  const Bytes f1 = read_bytes(p1), f2 = read_bytes(p2);
  CHECK(f1 == f2);
  CHECK(sha256_file(p1.string()) == sha256_file(p2.string()));

  REQUIRE(f1.size() >= 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f1[size_t(i)];
  CHECK(n % 8 == 0);
  REQUIRE(f1.size() == 8 + n + 3 + 8);
  const std::string header(f1.begin() + 8, f1.begin() + 8 + long(n));
  std::string expected =
      R"({"__metadata__":{"k":"v","z":"1"},"a":{"data_offsets":[3,11],"dtype":"F32","shape":[2]},)"
      R"("b":{"data_offsets":[0,3],"dtype":"U8","shape":[3]}})";
  expected.append((8 - expected.size() % 8) % 8, ' ');
  CHECK(header == expected);
  // Data in the given order: b's 3 bytes, then a's 8.
  CHECK(Bytes(f1.begin() + 8 + long(n), f1.begin() + 8 + long(n) + 3) == Bytes{9, 9, 9});
  // Without metadata there is no "__metadata__" key.
  const fs::path p3 = dir.path / "three.safetensors";
  write_safetensors(p3.string(), {make_view("a", a)}, {});
  const Bytes f3 = read_bytes(p3);
  const std::string h3(f3.begin() + 8, f3.end() - 8);
  CHECK(h3.find("__metadata__") == std::string::npos);
  CHECK(h3.size() % 8 == 0);
  CHECK(dir.entries() ==
        std::vector<std::string>{"one.safetensors", "three.safetensors", "two.safetensors"});
}

TEST_CASE("safetensors: a hand-built file is read correctly") {
  // Header written out by hand: tensors listed out of offset order, with whitespace, metadata,
  // a rank-0 tensor and a zero-size one; data laid out as the offsets say.
  const std::string header =
      "{ \"w\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [4, 12]},\n"
      "  \"__metadata__\": {\"origin\": \"test\"},\n"
      "  \"s\": {\"shape\": [], \"dtype\": \"U8\", \"data_offsets\": [0, 1]},\n"
      "  \"e\": {\"data_offsets\": [1, 1], \"dtype\": \"BF16\", \"shape\": [0, 5]},\n"
      "  \"p\": {\"dtype\": \"BF16\", \"shape\": [1, 1, 1], \"data_offsets\": [1, 3]},\n"
      "  \"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [1], \"data_offsets\": [3, 4]} }   ";
  const Bytes data = {0xAB, 0x80, 0x3F, 0x7E,               // s, p = bf16 1.0, q = e4m3 448
                      0xFF, 0xFF, 0xFF, 0xFF, 5, 0, 0, 0};  // w = {-1, 5}
  const SafetensorsFile f = parse(build(header, data));
  CHECK(f.source == kName);
  CHECK(f.metadata == std::map<std::string, std::string>{{"origin", "test"}});
  REQUIRE(f.tensors.size() == 5);
  // Offset order: s [0,1), e [1,1), p [1,3), q [3,4), w [4,12).
  CHECK(f.tensors[0].name == "s");
  CHECK(f.tensors[1].name == "e");
  CHECK(f.tensors[2].name == "p");
  CHECK(f.tensors[3].name == "q");
  CHECK(f.tensors[4].name == "w");
  CHECK(as_tensor<uint8_t>(f.get("s"), kName).shape == Shape{});
  CHECK(as_tensor<uint8_t>(f.get("s"), kName)[0] == 0xAB);
  CHECK(f.get("e").shape == Shape{0, 5});
  CHECK(f.get("e").bytes.empty());
  CHECK(as_tensor<bf16_t>(f.get("p"), kName)[0].bits == 0x3F80);
  CHECK(as_tensor<e4m3_t>(f.get("q"), kName)[0].bits == 0x7E);
  const Tensor<int32_t> w = as_tensor<int32_t>(f.get("w"), kName);
  CHECK(w.data == std::vector<int32_t>{-1, 5});

  // JSON whitespace around the object is fine (the reference library accepts it too).
  CHECK(parse(build(" \n{}\t ")).tensors.empty());
  // The smallest valid file: an empty object, no data.
  const SafetensorsFile empty = parse(build("{}"));
  CHECK(empty.tensors.empty());
  CHECK(empty.metadata.empty());
}

TEST_CASE("safetensors: malformed length fields are refused") {
  SUBCASE("truncated file") {
    check_refused(Bytes{}, {"shorter than the 8-byte header length"});
    check_refused(Bytes{2, 0, 0, 0, 0, 0, 0}, {"7 bytes", "header length"});
  }
  SUBCASE("header length 0") { check_refused(build_with_length(0, ""), {"header length is 0"}); }
  SUBCASE("header length beyond the file") {
    check_refused(build_with_length(100, "{}"), {"header length 100", "exceeds"});
    check_refused(build_with_length(3, "{}"), {"header length 3", "exceeds the 2 bytes"});
  }
  SUBCASE("absurd header length") {
    check_refused(build_with_length(100'000'001, "{}"), {"header length 100000001", "absurd"});
    check_refused(build_with_length(~uint64_t(0), "{}"), {"header length", "absurd"});
  }
}

TEST_CASE("safetensors: malformed header JSON is refused") {
  SUBCASE("bad JSON") {
    check_refused(build(R"({"a": {"dtype": "F32", )"), {"header: invalid JSON", "parse error"});
    check_refused(build(R"({"a": 1,})"), {"header: invalid JSON"});
    check_refused(build("{} x"), {"header: invalid JSON"});
  }
  SUBCASE("invalid UTF-8") {
    check_refused(build("{\"a\xff\": {}}"), {"header: invalid JSON", "UTF-8"});
    check_refused(build("{\"\xc0\xaf\": 1}"), {"header: invalid JSON", "UTF-8"});
    check_refused(build("{}\xff"), {"header: invalid JSON"});
  }
  SUBCASE("a NUL byte (nlohmann would stop reading there)") {
    check_refused(build(std::string("{}\0 garbage", 11)),
                  {"header: invalid JSON: NUL byte at header offset 2"});
    check_refused(build(std::string("{\"a\0\": 1}", 9)), {"header: invalid JSON: NUL byte"});
  }
  SUBCASE("absurd nesting") {
    check_refused(build("{\"a\": " + std::string(129, '[') + std::string(129, ']') + "}"),
                  {"header: invalid JSON: nested deeper than 128 levels"});
    check_refused(build("{\"a\": " + std::string(1'000'000, '[')),
                  {"header: invalid JSON: nested deeper than 128 levels"});
    // 128 levels parse; the entry is then refused for what it is.
    check_refused(build("{\"a\": " + std::string(127, '[') + std::string(127, ']') + "}"),
                  {"header: tensor 'a': entry is not an object"});
  }
  SUBCASE("a byte-order mark (nlohmann would skip it)") {
    check_refused(build("\xef\xbb\xbf{}"),
                  {"header: invalid JSON: starts with a UTF-8 byte-order mark"});
  }
  SUBCASE("not an object") {
    check_refused(build("[]"), {"header: not a JSON object"});
    check_refused(build(" 7"), {"header: not a JSON object"});
    check_refused(build("{\"a\": 1}"), {"header: tensor 'a': entry is not an object"});
  }
  SUBCASE("missing and extra fields") {
    check_refused(build(R"({"a": {"dtype": "F32", "shape": [1]}})", zeros(4)),
                  {"header: tensor 'a': missing field 'data_offsets'"});
    check_refused(build(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", zeros(4)),
                  {"header: tensor 'a': missing field 'dtype'"});
    check_refused(build(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", zeros(4)),
                  {"header: tensor 'a': missing field 'shape'"});
    check_refused(
        build(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}})", zeros(4)),
        {"header: tensor 'a': unexpected field 'x'"});
  }
  SUBCASE("dtype not a string or unknown") {
    check_refused(build(R"({"a": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", zeros(4)),
                  {"header: tensor 'a': dtype is not a string"});
    check_refused(
        build(R"({"a": {"dtype": "F31", "shape": [1], "data_offsets": [0, 4]}})", zeros(4)),
        {"header: tensor 'a': dtype: unknown dtype 'F31'"});
  }
  SUBCASE("shape not an array of non-negative integers") {
    check_refused(build(R"({"a": {"dtype": "U8", "shape": 4, "data_offsets": [0, 4]}})", zeros(4)),
                  {"header: tensor 'a': shape is not an array"});
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [2, -2], "data_offsets": [0, 4]}})", zeros(4)),
        {"header: tensor 'a': shape [2,-2]: dimension 1 is negative (-2)"});
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [4.0], "data_offsets": [0, 4]}})", zeros(4)),
        {"header: tensor 'a': shape", "dimension 0 is not an integer"});
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": ["4"], "data_offsets": [0, 4]}})", zeros(4)),
        {"header: tensor 'a': shape", "dimension 0 is not an integer"});
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [true], "data_offsets": [0, 1]}})", zeros(1)),
        {"header: tensor 'a': shape", "dimension 0 is not an integer"});
    check_refused(build(R"({"a": {"dtype": "U8", "shape": [9223372036854775808],)"
                        R"( "data_offsets": [0, 4]}})",
                        zeros(4)),
                  {"header: tensor 'a': shape", "dimension 0 does not fit int64"});
  }
  SUBCASE("overflowing shape") {
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296],)"
              R"( "data_offsets": [0, 4]}})",
              zeros(4)),
        {"header: tensor 'a': shape [4294967296,4294967296]: element count overflows int64"});
    // numel fits int64 but numel * 8 bytes does not fit uint64.
    check_refused(build(R"({"a": {"dtype": "F64", "shape": [4611686018427387904],)"
                        R"( "data_offsets": [0, 4]}})",
                        zeros(4)),
                  {"header: tensor 'a': shape [4611686018427387904]", "overflows uint64"});
  }
  SUBCASE("data_offsets not two non-negative integers with begin <= end") {
    for (const char* bad : {"[0]", "[0, 4, 8]", "[-1, 3]", "[0, 4.0]", "\"0,4\"", "[0, null]"}) {
      check_refused(
          build(std::string(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": )") + bad + "}}",
                zeros(4)),
          {"header: tensor 'a': data_offsets is not an array of 2 non-negative"});
    }
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", zeros(4)),
        {"header: tensor 'a': data_offsets [4, 0]: begin is after end"});
  }
  SUBCASE("__metadata__ not an object of strings") {
    check_refused(build(R"({"__metadata__": ["a"]})"), {"header: __metadata__ is not an object"});
    check_refused(build(R"({"__metadata__": null})"), {"header: __metadata__ is not an object"});
    check_refused(build(R"({"__metadata__": {"k": 1}})"),
                  {"header: __metadata__: value of 'k' is not a string"});
  }
}

TEST_CASE("safetensors: duplicate keys are refused") {
  check_refused(build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
                      R"( "a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
                      zeros(4)),
                {"header: duplicate tensor name 'a'"});
  // Same name, identical entries: still refused.
  check_refused(build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
                      R"( "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})",
                      zeros(2)),
                {"header: duplicate tensor name 'a'"});
  check_refused(
      build(R"({"a": {"dtype": "U8", "dtype": "I8", "shape": [2], "data_offsets": [0, 2]}})",
            zeros(2)),
      {"header: 'a': duplicate key 'dtype'"});
  check_refused(build(R"({"__metadata__": {"k": "1", "k": "2"}})"),
                {"header: '__metadata__': duplicate key 'k'"});
  check_refused(build(R"({"__metadata__": {}, "__metadata__": {}})"),
                {"header: duplicate tensor name '__metadata__'"});
  // The same key in different objects is fine.
  const SafetensorsFile f =
      parse(build(R"({"dtype": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
                  R"( "b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                  zeros(2)));
  CHECK(f.tensors.size() == 2);
}

TEST_CASE("safetensors: data offsets must match the dtype and tile the data buffer") {
  SUBCASE("wrong byte count") {
    check_refused(
        build(R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", zeros(12)),
        {"header: tensor 'a': data_offsets [0, 12] do not match dtype F32 and shape "
         "[2,2] (16 bytes)"});
    check_refused(
        build(R"({"a": {"dtype": "BF16", "shape": [], "data_offsets": [0, 4]}})", zeros(4)),
        {"header: tensor 'a': data_offsets [0, 4] do not match dtype BF16 and shape [] "
         "(2 bytes)"});
  }
  SUBCASE("out-of-range offsets") {
    check_refused(
        build(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", zeros(7)),
        {"header: tensor 'a': data_offsets [0, 8] reach beyond the data buffer (7 bytes)"});
    check_refused(build(R"({"a": {"dtype": "U8", "shape": [1],)"
                        R"( "data_offsets": [18446744073709551615, 0]}})"),
                  {"header: tensor 'a': data_offsets", "begin is after end"});
  }
  SUBCASE("overlapping ranges") {
    check_refused(build(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                        R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
                        zeros(6)),
                  {"header: tensor 'b': data_offsets [2, 6] overlap tensor 'a'"});
    check_refused(build(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                        R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
                        zeros(4)),
                  {"data_offsets [0, 4] overlap tensor 'a'"});
    // A zero-size tensor inside another one's range.
    check_refused(build(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                        R"( "z": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})",
                        zeros(4)),
                  {"header: tensor 'z': data_offsets [2, 2] overlap tensor 'a'"});
  }
  SUBCASE("holes and trailing bytes") {
    check_refused(build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},)"
                        R"( "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}})",
                        zeros(5)),
                  {"header: tensor 'b': data_offsets [3, 5] leave a hole: bytes [2, 3)"});
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})", zeros(3)),
        {"header: tensor 'a': data_offsets [1, 3] leave a hole: bytes [0, 1)"});
    check_refused(
        build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", zeros(3)),
        {"header: data_offsets", "end at byte 2", "3 bytes (trailing bytes)"});
    check_refused(build("{}", zeros(1)), {"header: data_offsets", "trailing bytes"});
  }
}

TEST_CASE("safetensors: typed access and lookup errors name the file and the tensor") {
  const SafetensorsFile f =
      parse(build(R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})", zeros(4)));
  std::string msg = error_of([&] { as_tensor<float>(f.get("a"), kName); });
  CHECK(msg == "h.safetensors: tensor 'a': dtype is BF16, expected F32");
  msg = error_of([&] { as_tensor<e4m3_t>(f.get("a"), kName); });
  CHECK(msg == "h.safetensors: tensor 'a': dtype is BF16, expected F8_E4M3");
  CHECK(as_tensor<bf16_t>(f.get("a"), kName).numel() == 2);
  msg = error_of([&] { f.get("b"); });
  CHECK(msg == "h.safetensors: tensor 'b' is missing");
  // A hand-made view whose bytes do not match its shape.
  TensorView v = f.get("a");
  v.bytes.pop_back();
  msg = error_of([&] { as_tensor<bf16_t>(v, "v"); });
  CHECK(msg.rfind("v: tensor 'a': 3 bytes do not match dtype BF16", 0) == 0);
}

TEST_CASE("safetensors: read_safetensors errors name the path") {
  TempDir dir;
  const std::string missing = (dir.path / "missing.safetensors").string();
  std::string msg = error_of([&] { read_safetensors(missing); });
  CHECK(msg.rfind(missing + ": cannot open: ", 0) == 0);
  CHECK(msg.find("No such file or directory") != std::string::npos);

  msg = error_of([&] { read_safetensors(dir.path.string()); });
  CHECK(msg.rfind(dir.path.string() + ": ", 0) == 0);

  const std::string small = (dir.path / "small.safetensors").string();
  Tensor<float> t({16});
  write_safetensors(small, {make_view("t", t)}, {});
  const uint64_t size = fs::file_size(small);
  CHECK(read_safetensors(small, size).tensors.size() == 1);
  msg = error_of([&] { read_safetensors(small, size - 1); });
  CHECK(msg.rfind(small + ": file size " + std::to_string(size), 0) == 0);
  CHECK(msg.find("exceeds the limit of " + std::to_string(size - 1)) != std::string::npos);
  // An index read bounds what it keeps, not the file: t (64 bytes) left on disk passes a limit
  // below the file's size; kept, it is refused.
  const SafetensorsIndex lazy = read_safetensors_index(small, 63, size - 60);
  CHECK(lazy.file.tensors.at(0).bytes.empty());
  msg = error_of([&] { read_safetensors_index(small, 64, size - 1); });
  CHECK(msg.rfind(small + ": the header and the tensors read whole hold " + std::to_string(size) + " bytes, beyond the limit of", 0) == 0);

  // A malformed file on disk: the message starts with its path.
  const std::string bad = (dir.path / "bad.safetensors").string();
  {
    const Bytes b =
        build(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", zeros(3));
    std::ofstream out(bad, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  msg = error_of([&] { read_safetensors(bad); });
  CHECK(msg.rfind(bad + ": header: data_offsets", 0) == 0);
}

TEST_CASE("safetensors: sha256 matches the FIPS 180-2 vectors") {
  const std::string abc = "abc";
  CHECK(sha256_hex(reinterpret_cast<const uint8_t*>(abc.data()), abc.size()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex(nullptr, 0) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(sha256_hex(reinterpret_cast<const uint8_t*>(two.data()), two.size()) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

  TempDir dir;
  const fs::path p = dir.path / "abc.txt";
  {
    std::ofstream out(p, std::ios::binary);
    out << abc;
  }
  CHECK(sha256_file(p.string()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const fs::path big = dir.path / "big.bin";
  {
    std::ofstream out(big, std::ios::binary);
    const std::string a(1'000'000, 'a');
    out << a << a;  // 2,000,000 bytes: more than one read chunk
  }
  const std::string a2(2'000'000, 'a');
  CHECK(sha256_file(big.string()) ==
        sha256_hex(reinterpret_cast<const uint8_t*>(a2.data()), a2.size()));
  const std::string a1(1'000'000, 'a');
  CHECK(sha256_hex(reinterpret_cast<const uint8_t*>(a1.data()), a1.size()) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::string msg = error_of([&] { sha256_file((dir.path / "nope").string()); });
  CHECK(msg.rfind((dir.path / "nope").string() + ": cannot open", 0) == 0);
}

TEST_CASE("safetensors: the writer leaves no temporary file and never a partial target") {
  TempDir dir;
  Tensor<float> t({3}, 1.5f);
  const std::string path = (dir.path / "out.safetensors").string();
  write_safetensors(path, {make_view("t", t)}, {{"k", "v"}});
  CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});
  // Overwriting replaces the file atomically and leaves nothing else.
  Tensor<float> t2({5}, 2.5f);
  write_safetensors(path, {make_view("t", t2)}, {});
  CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});
  CHECK(as_tensor<float>(read_safetensors(path).get("t"), path).data == t2.data);

  SUBCASE("non-existent directory") {
    const std::string nowhere = (dir.path / "no_such_dir" / "x.safetensors").string();
    const std::string msg = error_of([&] { write_safetensors(nowhere, {make_view("t", t)}, {}); });
    CHECK(msg.rfind(nowhere + ": ", 0) == 0);
    CHECK(msg.find("No such file or directory") != std::string::npos);
    CHECK(!fs::exists(dir.path / "no_such_dir"));
    CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});
  }
  SUBCASE("target is a directory: refused before any temporary file, the folder untouched") {
    fs::create_directories(dir.path / "adir" / "inner");
    const std::string target = (dir.path / "adir").string();
    const std::string msg = error_of([&] { write_safetensors(target, {make_view("t", t)}, {}); });
    CHECK(msg.rfind(target + ": exists and is not a regular file", 0) == 0);
    CHECK(fs::is_directory(dir.path / "adir" / "inner"));
    CHECK(dir.entries() == std::vector<std::string>{"adir", "out.safetensors"});
  }
  SUBCASE("invalid input creates nothing and keeps the old file") {
    TensorView bad = make_view("t", t);
    bad.bytes.pop_back();
    std::string msg = error_of([&] { write_safetensors(path, {bad}, {}); });
    CHECK(msg.rfind(path + ": tensor 't': 11 bytes do not match dtype F32 and shape [3]", 0) == 0);
    msg = error_of([&] { write_safetensors(path, {make_view("t", t), make_view("t", t)}, {}); });
    CHECK(msg.rfind(path + ": tensor 't': duplicate name", 0) == 0);
    msg = error_of([&] { write_safetensors(path, {make_view("__metadata__", t)}, {}); });
    CHECK(msg.rfind(path + ": tensor '__metadata__': ", 0) == 0);
    msg = error_of([&] { write_safetensors(path, {make_view("bad\xff", t)}, {}); });
    CHECK(msg.rfind(path + ": header: ", 0) == 0);
    CHECK(msg.find("UTF-8") != std::string::npos);
    CHECK(dir.entries() == std::vector<std::string>{"out.safetensors"});
    CHECK(as_tensor<float>(read_safetensors(path).get("t"), path).data == t2.data);
  }
}

TEST_CASE("safetensors: SafetensorsWriter appends tensors in header order, and refuses any other before writing a byte") {
  TempDir dir;
  const std::string path = (dir.path / "s.safetensors").string();
  const Tensor<float> a({2, 3}, 1.25f);
  const Tensor<int32_t> b({4}, 7);
  const std::vector<TensorSpec> specs = {{"a", DType::F32, {2, 3}}, {"b", DType::I32, {4}}};
  {
    SafetensorsWriter w(path, specs, {{"k", "v"}});
    CHECK(!fs::exists(path));  // the temporary file until finish()
    w.append(make_view("a", a));
    w.append(make_view("b", b));
    w.finish();
  }
  const std::string whole = (dir.path / "w.safetensors").string();
  write_safetensors(whole, {make_view("a", a), make_view("b", b)}, {{"k", "v"}});
  CHECK(sha256_file(path) == sha256_file(whole));  // the same bytes as the one-call writer
  fs::remove(whole);

  const std::string other = (dir.path / "o.safetensors").string();
  std::string msg = error_of([&] {
    SafetensorsWriter w(other, specs);
    w.append(make_view("b", b));
  });
  CHECK(msg == other + ": tensor 'b': expected 'a' F32 [2,3] next, got I32 [4]");
  msg = error_of([&] {
    SafetensorsWriter w(other, specs);
    w.append(make_view("a", Tensor<float>({3, 2}, 0.f)));
  });
  CHECK(msg == other + ": tensor 'a': expected 'a' F32 [2,3] next, got F32 [3,2]");
  msg = error_of([&] {
    SafetensorsWriter w(other, specs);
    w.append(make_view("a", a));
    w.finish();
  });
  CHECK(msg == other + ": tensor 'b' of the header was never written");
  msg = error_of([&] {
    SafetensorsWriter w(other, specs);
    w.append(make_view("a", a));
    w.append(make_view("b", b));
    w.append(make_view("b", b));
  });
  CHECK(msg == other + ": tensor 'b': every tensor of the header is already written");
  {
    SafetensorsWriter w(other, specs);  // destroyed unfinished (a builder's exception): nothing stays
    w.append(make_view("a", a));
  }
  CHECK(dir.entries() == std::vector<std::string>{"s.safetensors"});
}

TEST_CASE("safetensors: a large file (written past the page cache) holds exactly the bytes, on disk and on tmpfs") {
  // kDirectWriteMin bytes and more: write_safetensors takes O_DIRECT through its staging buffer
  // where the filesystem allows it (the last chunk padded, then the file truncated), the buffered
  // route elsewhere (tmpfs, /dev/shm). Odd sizes put the tensors and the end off every alignment.
  const int64_t big = int64_t(kDirectWriteMin / 4) + 4099;  // f32 elements: just over the threshold
  std::vector<TensorView> in;
  in.push_back(raw_view("a", DType::U8, {3}, 1));
  in.push_back(raw_view("big", DType::F32, {big}, 2));
  in.push_back(raw_view("tail", DType::BF16, {5, 7}, 3));
  TempDir dir;
  std::vector<fs::path> places{dir.path};
  if (fs::is_directory("/dev/shm")) places.push_back(fs::path("/dev/shm"));
  for (const fs::path& place : places) {
    const fs::path file = place / ("large." + std::to_string(::getpid()) + ".safetensors");
    CAPTURE(file.string());
    write_safetensors(file.string(), in);
    const std::string prefix = encode_header(file.string(), {{"a", DType::U8, {3}}, {"big", DType::F32, {big}},
                                                             {"tail", DType::BF16, {5, 7}}}, {});
    uint64_t total = prefix.size();
    for (const TensorView& v : in) total += v.bytes.size();
    CHECK(fs::file_size(file) == total);
    const SafetensorsFile f = read_safetensors(file.string());
    REQUIRE(f.tensors.size() == in.size());
    for (size_t i = 0; i < in.size(); ++i) CHECK(f.get(in[i].name).bytes == in[i].bytes);
    // The header bytes too (the reader would accept other padding).
    std::string head(prefix.size(), '\0');
    read_file_range(file.string(), 0, head.data(), head.size());
    CHECK(head == prefix);
    fs::remove(file);
  }
}

TEST_CASE("map_file_range: the file's bytes in place of a read, at any offset, and a short file refused") {
  TempDir dir;
  const fs::path file = dir.path / "bytes.bin";
  std::vector<uint8_t> bytes(3 * 4096 + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 131 + 7);
  {
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  // Offsets on and off a page: the mapping starts at the page below, the pointer at the offset.
  for (const uint64_t off : {uint64_t(0), uint64_t(8), uint64_t(4096), uint64_t(4100), uint64_t(8191)}) {
    CAPTURE(off);
    const size_t n = bytes.size() - size_t(off);
    const MappedRange m = map_file_range(file.string(), off, n);
    REQUIRE(m.p != nullptr);
    std::vector<uint8_t> read(n);
    read_file_range(file.string(), off, read.data(), n);
    CHECK(std::equal(read.begin(), read.end(), m.p));
    CHECK(std::equal(bytes.begin() + std::ptrdiff_t(off), bytes.end(), m.p));
  }
  // The owner keeps the mapping: a BorrowedTensor over it reads the bytes after the range's other
  // holders are gone.
  Tensor<uint8_t> t;
  {
    const MappedRange m = map_file_range(file.string(), 100, 50);
    t = BorrowedTensor<uint8_t>(Shape{50}, m.p, m.owner).take();
  }
  CHECK(t.data == std::vector<uint8_t>(bytes.begin() + 100, bytes.begin() + 150));
  CHECK(map_file_range(file.string(), 5, 0).p == nullptr);  // nothing to map
  CHECK_THROWS_WITH_AS(map_file_range(file.string(), 4096, bytes.size()), doctest::Contains("bytes.bin: file shrank"), Error);
  CHECK_THROWS_WITH_AS(map_file_range((dir.path / "absent.bin").string(), 0, 4), doctest::Contains("absent.bin: cannot open"), Error);
}
