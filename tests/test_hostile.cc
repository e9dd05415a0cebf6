// Hostile input through the indexshare CLI: malformed safetensors files, inconsistent or tampered
// golden sets, NaN/Inf candidates, unwritable outputs, oversized problems and a golden writer
// killed mid-way. Every refusal must exit 2 with a message naming the file and the field, leave no
// partial or temporary output, and never crash or hang (each command runs under `timeout 60`).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli_util.h"
#include "tools/lib/golden.h"
#include "tools/lib/safetensors.h"

extern char** environ;

using namespace indexshare;
namespace fs = std::filesystem;

namespace {

using Result = indexshare::testing::CliResult;

// Runs the CLI with `args` under `timeout SECONDS`: a timeout shows up as status 124, a crash as
// 128 + the signal (the shell's convention) or -1.
Result cli(const std::string& args, int seconds = 60) { return indexshare::testing::run_cli(args, seconds); }

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Checks a refusal: exit 2, every needle in the message, no crash report.
void refused(const Result& r, const std::vector<std::string>& needles) {
  INFO("output: " << (r.out.size() > 2000 ? r.out.substr(0, 1000) + " [...] " + r.out.substr(r.out.size() - 1000) : r.out));
  CHECK(r.status == 2);
  CHECK(has(r.out, "indexshare: error: "));
  for (const std::string& n : needles) CHECK_MESSAGE(has(r.out, n), "missing '" << n << "'");
  CHECK_FALSE(has(r.out, "internal error"));
  CHECK_FALSE(has(r.out, "Sanitizer"));
}

std::string golden_dir(const std::string& name) { return std::string(INDEXSHARE_SOURCE_DIR) + "/golden/" + name; }
const std::string kEdge = golden_dir("attention-edge");

struct TmpDir {
  fs::path path;
  TmpDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("indexshare-hostile-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // The names in the folder, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from a header text and a data buffer, with the length field given or
// computed.
std::string st_file(const std::string& header, const std::string& data = "", std::optional<uint64_t> length = {}) {
  const uint64_t n = length ? *length : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// A copy of a checked-in golden set in `dir`.
void copy_golden(const std::string& name, const std::string& dir) {
  fs::create_directories(dir);
  for (const char* f : {"manifest.json", golden::kTensorFile}) fs::copy_file(golden_dir(name) + "/" + f, dir + "/" + f);
}

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string s = read_bytes(path);
  const size_t pos = s.find(from);
  REQUIRE_MESSAGE(pos != std::string::npos, "'" << from << "' not in " << path);
  s.replace(pos, from.size(), to);
  write_bytes(path, s);
}

// A candidate for golden/attention-edge that reproduces it as a correct kernel reports it. (Not
// attn.indices: that set's indices are deliberately malformed inputs, which the judge flags.)
std::vector<io::TensorView> faithful_edge() {
  const golden::Loaded g = golden::read(kEdge);
  std::vector<io::TensorView> out;
  for (const char* n : {"layers.0.attn.out_bf16", "layers.0.attn.lse", "layers.0.attn.max_logits",
                        "layers.0.indexer.topk", "layers.0.indexer.logits"}) {
    io::TensorView v = g.get(n);
    if (v.name == "layers.0.attn.out_bf16") v.name = "layers.0.attn.out";
    out.push_back(v);
  }
  return out;
}

io::TensorView* find(std::vector<io::TensorView>& list, const std::string& name) {
  for (io::TensorView& v : list)
    if (v.name == name) return &v;
  FAIL("no tensor " << name);
  return nullptr;
}

void set_f32(io::TensorView& v, size_t i, float x) {
  REQUIRE(v.dtype == io::DType::F32);
  REQUIRE((i + 1) * 4 <= v.bytes.size());
  std::memcpy(v.bytes.mutable_data() + 4 * i, &x, 4);
}
void set_bf16(io::TensorView& v, size_t i, uint16_t bits) {
  REQUIRE(v.dtype == io::DType::BF16);
  REQUIRE((i + 1) * 2 <= v.bytes.size());
  std::memcpy(v.bytes.mutable_data() + 2 * i, &bits, 2);
}

std::string diff_cmd(const std::string& golden, const std::string& candidate) {
  return "diff --golden " + golden + " --candidate " + candidate;
}

}  // namespace

// ---- malformed safetensors ------------------------------------------------------------------

TEST_CASE("hostile: truncated safetensors files are refused naming the file") {
  TmpDir tmp;
  const std::string full = read_bytes(kEdge + "/" + golden::kTensorFile);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | uint8_t(full[size_t(i)]);
  struct Cut {
    size_t size;
    const char* needle;
  };
  const Cut cuts[] = {{0, "shorter than the 8-byte header length"},
                      {5, "shorter than the 8-byte header length"},
                      {8, "exceeds the 0 bytes after the length field"},
                      {size_t(8 + hlen / 2), "header length"},
                      {size_t(8 + hlen - 1), "header length"},
                      {size_t(8 + hlen), "data_offsets"},
                      {full.size() - 1, "reach beyond the data buffer"}};
  for (const Cut& c : cuts) {
    CAPTURE(c.size);
    // As a candidate of diff, and as the tensor file of a golden set.
    const std::string cand = tmp / (std::string("cut") + std::to_string(c.size) + ".safetensors");
    write_bytes(cand, full.substr(0, c.size));
    refused(cli(diff_cmd(kEdge, cand)), {cand + ": ", c.needle});
    const std::string set = tmp / (std::string("set") + std::to_string(c.size));
    copy_golden("attention-edge", set);
    write_bytes(set + "/" + golden::kTensorFile, full.substr(0, c.size));
    refused(cli("verify --golden " + set), {set + "/" + golden::kTensorFile + ": ", c.needle});
    refused(cli(diff_cmd(set, cand)), {set + "/" + golden::kTensorFile});
  }
}

TEST_CASE("hostile: header lengths beyond the file or absurdly large are refused") {
  TmpDir tmp;
  const std::string p = tmp / "h.safetensors";
  const std::string header = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
  const std::string after = std::to_string(header.size() + 2);
  const std::pair<uint64_t, std::string> cases[] = {
      {0, "header length is 0"},
      {header.size() + 3, "header length " + std::to_string(header.size() + 3) + " exceeds the " + after + " bytes"},
      {uint64_t(1) << 63, "header length 9223372036854775808 is absurd"},
      {UINT64_MAX, "header length 18446744073709551615 is absurd"},
      {io::kMaxHeaderBytes + 1, "is absurd (limit 100000000 bytes)"},
  };
  write_bytes(p, st_file(header, "ab"));
  CHECK(io::read_safetensors(p).tensors.size() == 1);  // the well-formed original
  for (const auto& [len, needle] : cases) {
    CAPTURE(len);
    write_bytes(p, st_file(header, "ab", len));
    refused(cli(diff_cmd(kEdge, p)), {p + ": ", needle});
  }
}

TEST_CASE("hostile: invalid UTF-8, invalid JSON and non-object headers are refused") {
  TmpDir tmp;
  const std::string p = tmp / "j.safetensors";
  const std::pair<std::string, std::string> cases[] = {
      {"{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", "invalid JSON"},    // invalid UTF-8
      {"{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", "invalid JSON"},  // overlong encoding
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}", "invalid JSON"},          // unterminated
      {"\xEF\xBB\xBF{}", "byte-order mark"},
      {std::string("{}\0 ", 4), "NUL byte"},
      {"[1,2,3]", "not a JSON object"},
      {"\"text\"", "not a JSON object"},
      {"{\"a\":1}", "tensor 'a': entry is not an object"},
      {"{\"a\":{\"dtype\":\"F33\",\"shape\":[0],\"data_offsets\":[0,0]}}", "tensor 'a': dtype: unknown dtype 'F33'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,0]}}", "tensor 'a': shape [1.5]: dimension 0 is not an integer"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", "dimension 0 is negative"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":1}}", "tensor 'a': unexpected field 'x'"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0]}}", "tensor 'a': missing field 'data_offsets'"},
      {"{\"__metadata__\":{\"k\":1}}", "__metadata__: value of 'k' is not a string"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
       "duplicate tensor name 'a'"},
      {std::string(200, '[') + std::string(200, ']'), "nested deeper than 128 levels"},
  };
  for (const auto& [header, needle] : cases) {
    CAPTURE(header);
    write_bytes(p, st_file(header));
    refused(cli(diff_cmd(kEdge, p)), {p + ": header", needle});
  }
}

TEST_CASE("hostile: overlapping, out-of-range and mis-sized data offsets are refused naming the tensor") {
  TmpDir tmp;
  const std::string p = tmp / "o.safetensors";
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) +
           "," + std::to_string(e) + "]}";
  };
  const std::string data(16, 'x');
  const std::pair<std::string, std::string> cases[] = {
      {"{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[8]", 4, 12) + "}", "tensor 'b': data_offsets [4, 12] overlap tensor 'a'"},
      {"{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[8]", 0, 8) + "}", "overlap tensor 'a'"},
      {"{" + entry("a", "U8", "[20]", 0, 20) + "}", "tensor 'a': data_offsets [0, 20] reach beyond the data buffer (16 bytes)"},
      {"{" + entry("a", "U8", "[0]", 18446744073709551615ull, 18446744073709551615ull) + "}", "reach beyond the data buffer"},
      {"{" + entry("a", "U8", "[4]", 12, 8) + "}", "tensor 'a': data_offsets [12, 8]: begin is after end"},
      {"{" + entry("a", "F32", "[2]", 0, 16) + "}", "tensor 'a': data_offsets [0, 16] do not match dtype F32 and shape [2] (8 bytes)"},
      {"{" + entry("a", "U8", "[8]", 0, 8) + "," + entry("b", "U8", "[4]", 12, 16) + "}", "leave a hole"},
      {"{" + entry("a", "U8", "[8]", 0, 8) + "}", "trailing bytes"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,-16]}}", "data_offsets is not an array of 2 non-negative integers"},
  };
  for (const auto& [header, needle] : cases) {
    CAPTURE(header);
    write_bytes(p, st_file(header, data));
    refused(cli(diff_cmd(kEdge, p)), {p + ": header", needle});
  }
}

TEST_CASE("hostile: shapes whose element or byte count overflows are refused") {
  TmpDir tmp;
  const std::string p = tmp / "s.safetensors";
  const std::pair<std::string, std::string> cases[] = {
      {"[4294967296,4294967296]", "tensor 'a': shape"},                            // 2^64 elements
      {"[9223372036854775807,2]", "tensor 'a': shape"},                            // int64 max * 2
      {"[4611686018427387904]", "byte count of dtype F32 overflows uint64"},      // 2^62 * 4 bytes
      {"[9223372036854775808]", "dimension 0 does not fit int64"},                // 2^63
      {"[18446744073709551616]", "dimension 0 is not an integer"},               // 2^64: a JSON float
      {"[9223372036854775807,2,0]", "tensor 'a': shape"},                   // overflow before a zero
  };
  for (const auto& [shape, needle] : cases) {
    CAPTURE(shape);
    write_bytes(p, st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,0]}}"));
    refused(cli(diff_cmd(kEdge, p)), {p + ": header", needle});
  }
  // A zero dimension first makes the element count 0 whatever follows (as in the reference
  // library, which folds the product left to right with checked multiplication): a valid file.
  write_bytes(p, st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775807,9223372036854775807],\"data_offsets\":[0,0]}}"));
  CHECK(io::read_safetensors(p).get("a").bytes.empty());
}

// ---- inconsistent or tampered golden sets -----------------------------------------------------

TEST_CASE("hostile: a golden whose manifest disagrees with its tensors is refused naming the field") {
  TmpDir tmp;
  const std::string set = tmp / "set", manifest = set + "/manifest.json", tensors = set + "/" + golden::kTensorFile;
  copy_golden("attention-edge", set);
  const std::string cand = tmp / "cand.safetensors";
  io::write_safetensors(cand, faithful_edge());
  REQUIRE(cli("verify --golden " + set).status == 0);
  REQUIRE(cli(diff_cmd(set, cand)).status == 0);
  // verify and diff both refuse the edited set, with the same message.
  auto both = [&](const std::vector<std::string>& needles) {
    refused(cli("verify --golden " + set), needles);
    refused(cli(diff_cmd(set, cand)), needles);
  };
  const std::string q_shape = "\"shape\": [\n        8,\n        8,\n        128\n      ]";
  SUBCASE("dtype") {
    replace_in_file(manifest, "\"dtype\": \"F8_E4M3\"", "\"dtype\": \"BF16\"");
    both({manifest + ": tensors[0] ('layers.0.indexer.q'): dtype BF16 in the manifest, F8_E4M3 in the file"});
  }
  SUBCASE("shape") {
    replace_in_file(manifest, q_shape, "\"shape\": [8, 8, 64, 2]");
    both({manifest + ": tensors[0] ('layers.0.indexer.q'): shape [8,8,64,2] in the manifest, [8,8,128] in the file"});
  }
  SUBCASE("shape that is not a list of integers") {
    replace_in_file(manifest, q_shape, "\"shape\": [8, \"8\", 128]");
    both({manifest + ": tensors[0] ('layers.0.indexer.q'): field 'shape' is not a list of integers"});
  }
  SUBCASE("an unknown dtype name") {
    replace_in_file(manifest, "\"dtype\": \"F8_E4M3\"", "\"dtype\": \"F8_E4M3FN\"");
    both({manifest + ": tensors[0] ('layers.0.indexer.q'): dtype F8_E4M3FN in the manifest, F8_E4M3 in the file"});
  }
  SUBCASE("a tensor named in the manifest but missing from the file") {
    replace_in_file(manifest, "\"name\": \"layers.0.attn.lse\"", "\"name\": \"layers.0.attn.lse_gone\"");
    both({tensors + ": tensor 'layers.0.attn.lse_gone' named in the manifest is missing"});
  }
  SUBCASE("a tensor in the file that the manifest does not list") {
    nlohmann::json m = nlohmann::json::parse(read_bytes(manifest));
    m["tensors"].erase(m["tensors"].size() - 1);
    write_bytes(manifest, m.dump(2));
    both({tensors + ": holds 20 tensors, the manifest lists 19"});
  }
  SUBCASE("a manifest entry that is not an object") {
    nlohmann::json m = nlohmann::json::parse(read_bytes(manifest));
    m["tensors"][2] = "layers.0.indexer.k_scale";
    write_bytes(manifest, m.dump(2));
    both({manifest + ": tensors[2]: field 'name' is missing or not a string"});
  }
  SUBCASE("a missing manifest field") {
    nlohmann::json m = nlohmann::json::parse(read_bytes(manifest));
    m.erase("tensors");
    write_bytes(manifest, m.dump(2));
    both({manifest + ": field 'tensors' is missing"});
  }
  SUBCASE("a manifest that is not JSON, or not an object, or empty") {
    write_bytes(manifest, "{\"format\": \"indexshare-golden\",");
    both({manifest + ": invalid JSON"});
    write_bytes(manifest, "[1, 2]");
    both({manifest + ": field 'format' is missing"});
    write_bytes(manifest, "");
    both({manifest + ": invalid JSON"});
  }
  SUBCASE("the tensor file is missing, or a folder") {
    fs::remove(tensors);
    both({tensors + ": cannot open"});
    fs::create_directories(tensors);
    both({tensors + ": not a regular file"});
  }
  SUBCASE("the manifest is missing") {
    fs::remove(manifest);
    both({manifest + ": cannot read"});
  }
}

// Regression (found by tests/fuzz/fuzz_manifest, fixed): golden::read verified only the manifest's
// "tensors" list, not the other fields its consumers use ("kind", "layers", "config", "budgets";
// no SHA-256 covers them). golden::summary (verify) and diff::judge read them with nlohmann's const
// operator[] (undefined behaviour for a missing key) and get<> (json::type_error, reported as
// "internal error", exit 3), and judge indexed its layer table with an unchecked "source" (a
// segfault for source >= n_layers). Each edit below must be refused with exit 2 naming
// manifest.json and the field.
TEST_CASE("hostile: a golden whose manifest fields are missing, mistyped or out of range is refused") {
  TmpDir tmp;
  const std::string set = tmp / "set", manifest = set + "/manifest.json";
  copy_golden("attention-edge", set);
  const nlohmann::json original = nlohmann::json::parse(read_bytes(manifest));
  const std::string cand = tmp / "cand.safetensors", with_indices = tmp / "indices.safetensors";
  io::write_safetensors(cand, faithful_edge());
  io::write_safetensors(with_indices, {golden::read(kEdge).get("layers.0.attn.indices")});
  struct Edit {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* field;
  };
  const Edit edits[] = {
      {"kind is a number", [](nlohmann::json& m) { m["kind"] = 5; }, "kind"},
      {"layers is a number", [](nlohmann::json& m) { m["layers"] = 5; }, "layers"},
      {"no layers", [](nlohmann::json& m) { m.erase("layers"); }, "layers"},
      {"no config", [](nlohmann::json& m) { m.erase("config"); }, "config"},
      {"no budgets", [](nlohmann::json& m) { m.erase("budgets"); }, "budgets"},
      {"config.s_q is a string", [](nlohmann::json& m) { m["config"]["s_q"] = "8"; }, "s_q"},
      {"config.s_q disagrees with the tensors", [](nlohmann::json& m) { m["config"]["s_q"] = 9; }, "s_q"},
      {"config.sm_scale beyond float", [](nlohmann::json& m) { m["config"]["sm_scale"] = 1e300; }, "sm_scale"},
      {"layers[0].source out of range", [](nlohmann::json& m) { m["layers"][0]["source"] = 100000; }, "source"},
      {"layers[0].source negative", [](nlohmann::json& m) { m["layers"][0]["source"] = -5; }, "source"},
      {"layers[0].kind unknown", [](nlohmann::json& m) { m["layers"][0]["kind"] = "half"; }, "kind"},
      {"a second layer without tensors", [](nlohmann::json& m) {
         m["layers"].push_back({{"index", 1}, {"kind", "shared"}, {"source", 0}, {"has_indexer", false}});
       }, "layers"},
  };
  for (const Edit& e : edits) {
    CAPTURE(e.what);
    nlohmann::json m = original;
    e.edit(m);
    write_bytes(manifest, m.dump(2));
    refused(cli("verify --golden " + set), {manifest, e.field});
    refused(cli(diff_cmd(set, cand)), {manifest, e.field});
    refused(cli(diff_cmd(set, with_indices)), {manifest, e.field});
  }
}

// Regression found by tests/fuzz/fuzz_manifest (reproducers in tests/fuzz/regressions/fuzz_manifest/
// budget-entry-*.json), fixed: budget entries that are not objects with a finite numeric
// budget_max_abs were read unchecked (undefined behaviour or a json::type_error, exit 3); they
// are now refused with exit 2 naming manifest.json and the field.
TEST_CASE("hostile: a golden whose attention budgets are malformed is refused") {
  TmpDir tmp;
  const std::string set = tmp / "set", manifest = set + "/manifest.json";
  copy_golden("attention-edge", set);
  const nlohmann::json original = nlohmann::json::parse(read_bytes(manifest));
  const std::string cand = tmp / "cand.safetensors";
  io::write_safetensors(cand, faithful_edge());
  for (const nlohmann::json& entry : {nlohmann::json::object(), nlohmann::json(5),
                                      nlohmann::json({{"budget_max_abs", "x"}}), nlohmann::json({{"budget_max_abs", -1}})}) {
    CAPTURE(entry.dump());
    nlohmann::json m = original;
    m["budgets"]["layers.0.attn.out"] = entry;
    write_bytes(manifest, m.dump(2));
    refused(cli("verify --golden " + set), {manifest, "budgets"});
    refused(cli(diff_cmd(set, cand)), {manifest, "budgets"});
  }
}

TEST_CASE("hostile: a golden whose tensor bytes no longer match the manifest is refused as tampered") {
  TmpDir tmp;
  const std::string set = tmp / "set", tensors = set + "/" + golden::kTensorFile;
  copy_golden("attention-edge", set);
  std::string bytes = read_bytes(tensors);
  bytes[bytes.size() - 100] = char(bytes[bytes.size() - 100] ^ 0x01);  // one bit of the last tensor's data
  write_bytes(tensors, bytes);
  const std::string msg = "the tensor's bytes do not match field 'sha256' (the golden set is tampered or corrupted)";
  refused(cli("verify --golden " + set), {set + "/manifest.json: tensors[", msg});
  const std::string cand = tmp / "cand.safetensors";
  io::write_safetensors(cand, faithful_edge());
  refused(cli(diff_cmd(set, cand)), {msg});
  // A hash edited in the manifest instead of the data: the same refusal.
  copy_golden("attention-edge", tmp / "set2");
  const nlohmann::json m = nlohmann::json::parse(read_bytes(tmp / "set2/manifest.json"));
  replace_in_file(tmp / "set2/manifest.json", m["tensors"][3]["sha256"].get<std::string>(), std::string(64, '0'));
  refused(cli("verify --golden " + tmp / "set2"), {"tensors[3] ('" + m["tensors"][3]["name"].get<std::string>() + "')", msg});
}

// ---- candidates -----------------------------------------------------------------------------

TEST_CASE("hostile: candidates with wrong dtypes, shapes or names are bad input (exit 2)") {
  TmpDir tmp;
  const std::string cand = tmp / "cand.safetensors";
  std::vector<io::TensorView> list = faithful_edge();
  CHECK(cli(diff_cmd(kEdge, cand)).status == 2);  // does not exist yet
  refused(cli(diff_cmd(kEdge, cand)), {cand + ": cannot open"});
  io::write_safetensors(cand, list);
  CHECK(cli(diff_cmd(kEdge, cand)).status == 0);
  SUBCASE("dtype") {
    find(list, "layers.0.attn.lse")->dtype = io::DType::I32;
    io::write_safetensors(cand, list);
    refused(cli(diff_cmd(kEdge, cand)), {cand + ": tensor 'layers.0.attn.lse': dtype is I32"});
  }
  SUBCASE("shape") {
    find(list, "layers.0.attn.lse")->shape = {4, 8};
    io::write_safetensors(cand, list);
    refused(cli(diff_cmd(kEdge, cand)), {cand + ": tensor 'layers.0.attn.lse': expected shape [8,4], got [4,8]"});
  }
  SUBCASE("an unknown name, a layer beyond the set, nothing to judge") {
    io::write_safetensors(cand, {io::make_view("layers.0.attn.outt", Tensor<float>({1}))});
    refused(cli(diff_cmd(kEdge, cand)), {cand + ": tensor 'layers.0.attn.outt' is not a golden output name"});
    io::write_safetensors(cand, {io::make_view("layers.1.attn.lse", Tensor<float>({8, 4}))});
    refused(cli(diff_cmd(kEdge, cand)), {"layer 1 is outside the golden set's 1 layers"});
    io::write_safetensors(cand, {io::make_view("layers.99999999999.attn.lse", Tensor<float>({8, 4}))});
    refused(cli(diff_cmd(kEdge, cand)), {"layers.99999999999.attn.lse"});
    io::write_safetensors(cand, {});
    refused(cli(diff_cmd(kEdge, cand)), {cand + ": no golden output names to judge"});
  }
  SUBCASE("a candidate that is a folder or a device") {
    refused(cli(diff_cmd(kEdge, tmp.path.string())), {tmp.path.string() + ": "});
    refused(cli(diff_cmd(kEdge, "/dev/zero")), {"/dev/zero: not a regular file"});
  }
}

TEST_CASE("hostile: NaN and Inf in candidate outputs fail the check (exit 1), never crash") {
  TmpDir tmp;
  const std::string cand = tmp / "cand.safetensors";
  const std::vector<io::TensorView> base = faithful_edge();
  // Row 7 is an ordinary row (rows 0 and 6 of the attention-edge set are empty).
  SUBCASE("NaN in attn.out (bf16) where the golden is finite") {
    std::vector<io::TensorView> list = base;
    set_bf16(*find(list, "layers.0.attn.out"), 7 * 4 * 512 + 3, 0x7FC0);
    io::write_safetensors(cand, list);
    const Result r = cli(diff_cmd(kEdge, cand));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(has(r.out, "layer  0 attn.out"));
    CHECK(has(r.out, "FAIL"));
  }
  SUBCASE("+Inf and -Inf in attn.lse where the golden is finite") {
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<io::TensorView> list = base;
      set_f32(*find(list, "layers.0.attn.lse"), 7 * 4 + 1, bad);
      io::write_safetensors(cand, list);
      const Result r = cli(diff_cmd(kEdge, cand));
      INFO(bad << ": " << r.out);
      CHECK(r.status == 1);
      CHECK(has(r.out, "attn.lse"));
      CHECK(has(r.out, "inf/NaN positions differ"));
    }
  }
  SUBCASE("NaN in indexer.logits and attn.max_logits") {
    std::vector<io::TensorView> list = base;
    set_f32(*find(list, "layers.0.indexer.logits"), 7 * 64 + 5, std::numeric_limits<float>::quiet_NaN());
    set_f32(*find(list, "layers.0.attn.max_logits"), 7 * 4, std::numeric_limits<float>::quiet_NaN());
    io::write_safetensors(cand, list);
    const Result r = cli(diff_cmd(kEdge, cand) + " --json " + tmp / "report.json");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(has(r.out, "indexer.logits"));
    CHECK(has(r.out, "attn.max_logits"));
    // The JSON report is written completely even for a failing candidate, with NaN as null.
    const nlohmann::json j = nlohmann::json::parse(read_bytes(tmp / "report.json"));
    CHECK(j["verdict"] == "FAIL");
  }
  SUBCASE("an all-NaN candidate") {
    std::vector<io::TensorView> list = base;
    for (io::TensorView& v : list) {
      if (v.dtype == io::DType::F32)
        for (size_t i = 0; i * 4 < v.bytes.size(); ++i) set_f32(v, i, std::numeric_limits<float>::quiet_NaN());
      if (v.dtype == io::DType::BF16)
        for (size_t i = 0; i * 2 < v.bytes.size(); ++i) set_bf16(v, i, 0xFFC1);
    }
    io::write_safetensors(cand, list);
    const Result r = cli(diff_cmd(kEdge, cand));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_FALSE(has(r.out, "internal error"));
  }
  SUBCASE("Inf where the golden has the same Inf passes (empty rows: lse +inf, max_logits -inf)") {
    std::vector<io::TensorView> list = base;
    const golden::Loaded g = golden::read(kEdge);
    const Tensor<float> lse = g.tensor<float>("layers.0.attn.lse");
    CHECK(std::isinf(lse[0]));
    io::write_safetensors(cand, list);
    CHECK(cli(diff_cmd(kEdge, cand)).status == 0);
  }
}

// ---- unwritable outputs ---------------------------------------------------------------------

TEST_CASE("hostile: unwritable output folders are refused with exit 2 and nothing left behind") {
  TmpDir tmp;
  const std::string file = tmp / "regular-file";
  write_bytes(file, "x");
  const std::string golden_args = "golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --out ";
  // Under a regular file (tests run as root, so a chmod-based read-only folder would not stop us).
  refused(cli(golden_args + file + "/set"), {file + "/set"});
  refused(cli(golden_args + file + "/deeper/set"), {file});
  // An existing regular file as the output folder.
  refused(cli(golden_args + file), {file + ": exists and is not a folder"});
  CHECK(read_bytes(file) == "x");
  // Under /proc (not writable even for root).
  refused(cli(golden_args + "/proc/indexshare-hostile-set"), {"/proc/indexshare-hostile-set"});
  CHECK_FALSE(fs::exists("/proc/indexshare-hostile-set"));
  // An empty --out.
  refused(cli(golden_args + "''"), {"--out"});
  // diff --json and cost --json under a regular file: the report is refused, no temporary file.
  const std::string cand = tmp / "cand.safetensors";
  io::write_safetensors(cand, faithful_edge());
  refused(cli(diff_cmd(kEdge, cand) + " --json " + file + "/report.json"), {file + "/report.json"});
  refused(cli("cost --preset tiny-glm --json " + file + "/cost.json"), {file + "/cost.json"});
  refused(cli("cost --preset tiny-glm --json /proc/indexshare-hostile.json"), {"/proc/indexshare-hostile.json"});
  // Nothing but the regular file and the candidate is left in the folder.
  CHECK(tmp.entries() == std::vector<std::string>{"cand.safetensors", "regular-file"});
  // A refused candidate writes no JSON report at all.
  write_bytes(tmp / "bad.safetensors", "garbage");
  refused(cli(diff_cmd(kEdge, tmp / "bad.safetensors") + " --json " + tmp / "report.json"), {"bad.safetensors"});
  CHECK_FALSE(fs::exists(tmp / "report.json"));
}

TEST_CASE("hostile: a refused golden leaves neither the folder nor a temporary one") {
  TmpDir tmp;
  const std::string out = tmp / "set";
  refused(cli("golden --problem 'sq4 skv12 nl2 sched=SF' --out " + out), {"SF"});
  refused(cli("golden --problem 'sq4 skv2' --out " + out), {"skv (2) must be >= sq (4)"});
  refused(cli("golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --kind bogus --out " + out), {"unknown kind 'bogus'"});
  CHECK(tmp.entries().empty());
  // --force never replaces a folder that is not a golden set, and leaves it untouched: a manifest.json
  // beside other files, one that is not a golden manifest, or a folder named manifest.json (each of
  // the first two deleted the folder before).
  const std::string force = "golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --force --out " + out;
  fs::create_directories(out);
  write_bytes(out + "/keep.txt", "keep");
  refused(cli(force), {"'keep.txt' is not one of its files"});
  CHECK(read_bytes(out + "/keep.txt") == "keep");
  write_bytes(out + "/manifest.json", "hello");
  refused(cli(force), {"'keep.txt' is not one of its files"});
  CHECK(read_bytes(out + "/keep.txt") == "keep");
  fs::remove(out + "/keep.txt");
  for (const char* text : {"hello", "{}", "{\"format\": \"other\"}", "[1]"}) {
    write_bytes(out + "/manifest.json", text);
    refused(cli(force), {"its manifest.json is not one"});
    CHECK(read_bytes(out + "/manifest.json") == text);
  }
  fs::remove(out + "/manifest.json");
  fs::create_directories(out + "/manifest.json");
  refused(cli(force), {"'manifest.json' is not one of its files"});
  CHECK(fs::is_directory(out + "/manifest.json"));
  CHECK(tmp.entries() == std::vector<std::string>{"set"});
}

// ---- the killed writer ----------------------------------------------------------------------

namespace {

// Starts the CLI with argv (stdout and stderr to /dev/null); returns its pid.
pid_t spawn_cli(const std::vector<std::string>& args) {
  std::vector<std::string> all = {INDEXSHARE_CLI};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

bool any_entry_starting(const fs::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

// A started CLI process; reaped at most once, so a pid is never signalled after it was reaped.
struct Child {
  pid_t pid;
  bool done = false;
  int status = 0;
  bool poll() {
    if (!done && ::waitpid(pid, &status, WNOHANG) == pid) done = true;
    return done;
  }
  // Kills the process with SIGKILL at `at` unless it exited before; returns true if it was killed.
  // Never waits more than 60 s.
  bool kill_at(std::chrono::steady_clock::time_point at) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < at && std::chrono::steady_clock::now() < deadline) {
      if (poll()) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (poll()) return false;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    done = true;
    return WIFSIGNALED(status);
  }
  // Waits until the writer's temporary folder "<out>.tmp.<pid>" exists, the process exits, or 60 s
  // pass.
  void wait_for_tmp(const std::string& out) {
    const fs::path tmp = out + ".tmp." + std::to_string(pid);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(tmp) && !poll() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
};

}  // namespace

TEST_CASE("hostile: a golden writer killed at any moment leaves no half-written set") {
  TmpDir tmp;
  // Large enough that computing takes a while and the files take a few milliseconds to write.
  const std::string problem = "sq32 skv256 hq16 dqk576 dv512 ih16 id128 k64 nl2";  // 0.4 s, 5 MB
  int killed = 0, complete = 0, absent = 0, leftovers = 0;
  std::string log;
  auto check_out = [&](const std::string& out, const std::string& what) {
    CAPTURE(what);
    const std::string name = fs::path(out).filename().string();
    log += "  " + what + ": ";
    if (fs::exists(out)) {
      const Result r = cli("verify --golden " + out);
      INFO(r.out);
      CHECK(r.status == 0);  // complete and valid, never partial
      ++complete;
      log += "complete set (" + nlohmann::json::parse(read_bytes(out + "/manifest.json"))["problem"].get<std::string>() + ")";
    } else {
      ++absent;
      log += "no set";
    }
    for (const char* kind : {".tmp.", ".old."})
      if (any_entry_starting(tmp.path, name + kind)) {
        log += std::string(", leftover ") + name + kind + "<pid>";
        leftovers += std::string(kind) == ".tmp.";
      }
    log += "\n";
  };
  // 1. Kills at fixed delays after the start (mostly while computing).
  for (int ms : {0, 50, 150, 300}) {
    const std::string out = tmp / (std::string("a") + std::to_string(ms));
    const auto t0 = std::chrono::steady_clock::now();
    Child c{spawn_cli({"golden", "--problem", problem, "--out", out})};
    killed += c.kill_at(t0 + std::chrono::milliseconds(ms));
    check_out(out, std::string("killed ") + std::to_string(ms) + " ms after the start");
  }
  // 2. Kills while writing: wait for the temporary folder to appear, then kill after a delay.
  for (int us : {0, 500, 2000, 5000, 20000, 100000, 300000}) {
    std::string name = "w";
    name += std::to_string(us);
    const std::string out = tmp / name;
    Child c{spawn_cli({"golden", "--problem", problem, "--out", out})};
    c.wait_for_tmp(out);
    killed += c.kill_at(std::chrono::steady_clock::now() + std::chrono::microseconds(us));
    check_out(out, std::string("killed ") + std::to_string(us) + " us after the temporary folder appeared");
  }
  // 3. Replacing an existing set with --force, killed while writing: the folder holds the old set
  //    or the new one, complete, or (in the instant between the two renames) nothing.
  const std::string out = tmp / "f";
  REQUIRE(cli("golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --out " + out).status == 0);
  for (int us : {0, 1000, 5000}) {
    Child c{spawn_cli({"golden", "--problem", problem, "--force", "--out", out})};
    c.wait_for_tmp(out);
    killed += c.kill_at(std::chrono::steady_clock::now() + std::chrono::microseconds(us));
    check_out(out, std::string("--force killed ") + std::to_string(us) + " us after the temporary folder appeared");
  }
  MESSAGE("killed writers: " << killed << " of 14; output complete " << complete << ", absent " << absent
                             << ", leftover .tmp folders " << leftovers << "\n" << log);
  CHECK(killed >= 4);  // at least the early kills hit a running writer
}

// ---- resource limits ------------------------------------------------------------------------

TEST_CASE("hostile: outputs are written all or none, never over a folder, FIFO or device, and limits hold") {
  TmpDir tmp;
  const std::string src = "overlap --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id32 k8 nl4 sched=FFSS'";
  // One unwritable output: none of the others appears (json and csv were left behind before).
  refused(cli(src + " --json " + tmp / "a.json" + " --csv " + tmp / "a.csv" + " --svg " + tmp / "no/such/dir/x.svg"),
          {"x.svg", "cannot write"});
  CHECK(tmp.entries().empty());
  // Two outputs on one path (the CSV silently replaced the JSON).
  refused(cli(src + " --json " + tmp / "b.json" + " --csv " + tmp / "./b.json"), {"b.json: named for two outputs"});
  refused(cli("search --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id32 k8 nl2 own=yes' -n 1 --json " + tmp / "s" +
              " --svg " + tmp / "s"),
          {"named for two outputs"});
  CHECK(tmp.entries().empty());
  // A FIFO or a folder in an output's place is refused and left as it was (the rename replaced a
  // FIFO, and /dev/full when run as root).
  const std::string fifo = tmp / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  fs::create_directories(tmp / "dir");
  for (const std::string& out : {fifo, tmp / "dir"}) {
    refused(cli(src + " --json " + out), {"exists and is not a regular file"});
    refused(cli("cost --preset glm-5.2 --context 4096 --json " + out), {"exists and is not a regular file"});
    refused(cli("bench --impl ref --module-preset none --json " + out), {"exists and is not a regular file"});
  }
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_directory(tmp / "dir"));
  CHECK(tmp.entries() == std::vector<std::string>{"dir", "fifo"});
  // Limits: 100000 threads crashed bench (SIGSEGV), 10^8 buckets ran out of memory, a cost factor
  // of 1e300 printed inf and NaN shares.
  refused(cli("bench --threads 100000 --stack-seq 0"), {"--threads must be in [1, 1024]"});
  refused(cli(src + " --buckets 100000000"), {"--buckets must be in [1, 4096]"});
  refused(cli("cost --preset glm-5.2 --context 4096 --flops-per-mac 1e300"), {"flops_per_mac", "<= 1e6, got 1e+300"});
}

TEST_CASE("hostile: an option the chosen mode does not read, or an override out of range, is refused") {
  TmpDir tmp;
  const std::string out = " --out " + tmp / "set";
  // Out of range: never wrapped (4294967297 was int 1 layer) or ignored (negative meant the default).
  for (const std::string& c : std::vector<std::string>{"run --layers -3", "run --layers 0",
                                                      "run --model tiny-glm --layers 4294967297",
                                                      "golden --preset ties --layers 1000001" + out})
    refused(cli(c), {"--layers must be in [1, 10^6]"});
  for (const std::string& c : std::vector<std::string>{"run --model tiny-glm --seq -5", "run --model tiny-glm --seq 2147483648",
                                                      "golden --preset ties --seq 0" + out,
                                                      "golden --model tiny-glm --seq -1" + out})
    refused(cli(c), {"--seq must be in [1, 2^31 - 1]"});
  // Seeds: negative was "not given" (golden used seed 1), 2^64 - 1 saturated to 2^63 - 1.
  refused(cli("golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --seed -7" + out), {"--seed must be >= 0, got -7"});
  refused(cli("run --model tiny-glm --seq 16 --seed -1"), {"--seed must be >= 0, got -1"});
  for (const char* v : {"18446744073709551615", "99999999999999999999"})
    refused(cli(std::string("run --model tiny-glm --seq 16 --seed ") + v), {std::string("--seed: '") + v + "' is out of range"});
  refused(cli("run --layers 99999999999999999999"), {"--layers: '99999999999999999999' is out of range"});
  // Descriptor fields the generator would not read (the run was the same bytes without them).
  refused(cli("run --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id1 k8 recency=5'"), {"recency and sinks need id >= 2"});
  refused(cli("run --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id1 k8 sinks=8'"), {"recency and sinks need id >= 2"});
  refused(cli("run --problem 'sq16 skv64 hq4 dqk64 dv32 ih4 id32 k8 indexer=bf16 scale=fp32_amax'"),
          {"scale applies to indexer=fp8 only"});
  // Options of a part the command skips, or of another source (each ran and ignored the option).
  const struct {
    const char* cmd;
    const char* says;
  } skipped[] = {
      {"bench --impl ref --threads 3", "--threads applies to --impl simd only"},
      {"bench --impl ref --target AVX2", "--target applies to --impl simd only"},
      {"bench --stack-seq 0 --stack-sq 7", "--stack-sq applies to the stack only"},
      {"bench --stack-seq 0 --stack-topk 9", "--stack-topk applies to the stack only"},
      {"bench --stack-seq 0 --module-preset none --module-rows 5", "--module-rows applies to the module stage only"},
      {"cost --preset glm-5.2 --print-config --json x.json", "--json applies to the cost tables only"},
      {"cost --preset glm-5.2 --print-config --context 4096", "--context applies to the cost tables only"},
      {"cost --preset glm-5.2 --mode decode --prefill-tile 32", "--prefill-tile applies to --mode prefill or both only"},
      {"overlap --golden GOLDEN --from-problem k8", "--from-problem applies to --from only"},
      {"overlap --golden GOLDEN --max-memory 1K", "--max-memory applies to --problem only"},
      {"search --golden GOLDEN --max-memory 1K -n 1", "--max-memory applies to --problem only"},
      {"search --problem 'sq8 skv24 hq2 dqk16 dv8 ih4 id16 k4 nl2 sched=FS' -n 1", "sched=FS is not read"},
      {"search --problem 'sq8 skv24 hq2 dqk16 dv8 ih4 id16 k4 nl2 own=no' -n 1", "own=no is not read"},
      {"golden --preset ties --kind attention-edge OUT", "--kind applies to --problem only"},
      {"golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --impl ref --target AVX2 OUT", "--target applies to the simd path"},
      {"run --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --impl ref --target AVX2", "--target applies to the simd path"},
      {"run --model tiny-glm --seq 16 --impl ref --target AVX2", "--target applies to the simd path"},
      // Empty values meant "not given" (--json "" wrote nothing, --problem "" ran the default).
      {"run --problem ''", "--problem: an empty value"},
      {"overlap --golden GOLDEN --json ''", "--json: an empty value"},
      {"cost --preset glm-5.2 --json ''", "--json: an empty value"},
  };
  for (const auto& s : skipped) {
    std::string c = s.cmd;
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"GOLDEN", kEdge.substr(0, kEdge.rfind('/')) + "/ties"},
                                   {"OUT", out.substr(1)}})
      if (const size_t at = c.find(from); at != std::string::npos) c.replace(at, from.size(), to);
    CAPTURE(c);
    refused(cli(c), {s.says});
  }
  // A model config with a duplicated key (the last one won) or that is a folder ("invalid JSON").
  {
    const std::string cfg = tmp / "cfg.json";
    write_bytes(tmp / "cfg0.json", cli("cost --preset tiny-glm --print-config").out);
    std::string text = read_bytes(tmp / "cfg0.json");
    REQUIRE(text.find("\"n_layers\"") != std::string::npos);
    text.replace(text.find("\"n_layers\""), 0, "\"n_layers\": 78, ");
    write_bytes(cfg, text);
    refused(cli("cost --config " + cfg), {cfg + ": duplicate key 'n_layers'"});
    CHECK(cli("cost --config " + tmp / "cfg0.json").status == 0);
    refused(cli("cost --config " + tmp.path.string()), {"not a regular file (a folder)"});
    fs::remove(cfg);
    fs::remove(tmp / "cfg0.json");
  }
  // Usage errors carry the same prefix and name the token.
  refused(cli("run --bogus"), {"--bogus"});
  refused(cli("bogus"), {"unknown command 'bogus'", "run, golden"});
  refused(cli("run --model tiny-glm --seed 1e3"), {"--seed", "1e3"});
  refused(cli("verify"), {"--golden is required"});
  // Options of another mode: before, each of these ran the default and ignored the option.
  for (const char* o : {"--seq 100", "--seed 5", "--sim 0.5", "--variant hf_bf16"}) {
    refused(cli(std::string("run ") + o), {std::string(o).substr(0, std::string(o).find(' ')) + " applies to --model only"});
    refused(cli(std::string("run --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' ") + o), {"applies to --model only"});
  }
  for (const char* o : {"--schedule FS", "--sim 0.5", "--variant hf_bf16"})
    refused(cli(std::string("golden --preset ties ") + o + out), {"applies to --model only", "sched="});
  for (const char* o : {"--kind stack", "--no-logits"})
    refused(cli(std::string("golden --model tiny-glm ") + o + out), {"applies to kernel-level sets"});
  for (const char* o : {"--seq 5", "--layers 2", "--seed 3", "--kind stack"})
    refused(cli(std::string("golden --from ") + tmp / "dump.safetensors " + o + out),
            {"applies to generated sets", "--from takes shapes"});
  // The module-level toy model is estimated against --max-memory too (its traces keep every
  // layer's [seq, seq] logits): a large --seq was std::bad_alloc, a real preset's 78 layers an
  // allocation of tens of GB.
  refused(cli("golden --model tiny-glm --seq 100000000" + out, 20), {"tiny-glm toy model needs about", "golden set",
                                                                     "use a smaller --seq or --layers"});
  refused(cli("run --model glm-5.2", 20), {"glm-5.2 toy model needs about", "above --max-memory"});
  refused(cli("run --model tiny-glm --seq 64 --max-memory 1K"), {"above --max-memory"});
  CHECK(cli("run --model tiny-glm --seq 64").status == 0);
  CHECK(tmp.entries().empty());
}

TEST_CASE("hostile: problems beyond --max-memory are refused before anything is allocated or written") {
  TmpDir tmp;
  // Shapes whose tensors could never be allocated, or only just: refused at once by the estimate,
  // never std::bad_alloc (exit 3), a signal, a sanitizer report or a hang.
  for (const char* p : {"sq1000000000 skv1000000000", "sq1 skv2147483647 k2147483647",
                        "sq100000 skv100000 hq1 dqk16 dv8 ih1 id16 k4", "sq1 skv1 hq1000000 dqk1000000 dv1"}) {
    CAPTURE(p);
    // The third problem fits in memory where the indexer streams (simd in FP8 mode, --impl auto
    // takes simd there): it is only slow, so it runs only where the estimate must refuse it: with
    // --impl ref, whose indexer materialises one layer's [s_q, s_kv] logits (40 GB).
    const bool streams_fit = std::string(p).rfind("sq100000 ", 0) == 0;
    // Each command suggests the remedies it offers, and no option it lacks.
    struct Cmd {
      std::string cmd;
      std::vector<std::string> offers, lacks;
    };
    const std::vector<std::string> none = {"--rows", "--no-logits", "--stack-seq", "--impl simd"};
    std::vector<Cmd> cmds;
    if (streams_fit) {
      const std::vector<std::string> via = {"use --impl simd (streams the indexer), "};
      cmds = {{"run --impl ref", {via[0] + "--rows", "a smaller --problem"}, {"--no-logits", "--stack-seq"}},
              {"overlap --impl ref", {via[0] + "a smaller --problem"}, {"--rows", "--no-logits", "--stack-seq"}},
              {"search --impl ref", {via[0] + "a smaller --problem"}, {"--rows", "--no-logits", "--stack-seq"}},
              {"golden --no-logits --out " + tmp / "set", {via[0] + "--rows"}, {"--no-logits", "--stack-seq"}},
              {"golden --out " + tmp / "set", {"use --no-logits with --impl simd (the indexer then streams), --rows"}, {}}};
    } else {
      cmds = {{"run", {"use --rows", "a smaller --problem"}, {"--no-logits", "--stack-seq", "--impl simd"}},
              {"overlap", {"use a smaller --problem"}, none},
              {"search", {"use a smaller --problem"}, none},
              {"bench --stack-seq 0", {"use a smaller --problem"}, none},
              {"golden --out " + tmp / "set", {"use --no-logits, --rows", "a smaller --problem"}, {"--impl simd"}},
              {"golden --impl simd --no-logits --out " + tmp / "set", {"use --rows"}, {"--no-logits", "--impl simd"}}};
    }
    for (const Cmd& c : cmds) {
      CAPTURE(c.cmd);
      const Result r = cli(c.cmd + " --problem '" + p + "'", 20);
      std::vector<std::string> needles = c.offers;
      needles.push_back("above --max-memory");
      needles.push_back(", or raise --max-memory");
      refused(r, needles);
      for (const std::string& l : c.lacks) CHECK_MESSAGE(!has(r.out, l), "suggests '" << l << "'");
    }
  }
  // The limit can be lowered; a bad limit is a usage error.
  const std::string small = "golden --problem 'sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4' --out " + tmp / "set";
  refused(cli(small + " --max-memory 1K"), {"above --max-memory"});
  refused(cli(small + " --max-memory lots"), {"--max-memory", "'lots'"});
  refused(cli(small + " --max-memory 8Q"), {"--max-memory", "'8Q'"});
  CHECK(tmp.entries().empty());
  // bench's stack comparison is estimated too (here at 2^31 - 1 keys).
  refused(cli("bench --impl simd --module-preset none --stack-seq 2147483647", 20),
          {"above --max-memory", "for the stack: use a smaller --stack-seq or --stack-sq"});
  // Element counts that overflow int64 are refused as such.
  refused(cli("run --problem 'sq1 skv1 hq1000000000000 dqk1000000000000 dv1' --max-memory 999999999999999"),
          {"problem field hq must be <= 2^31 - 1"});
}

// Regressions found by tests/fuzz/fuzz_problem and by hand (both fixed): nl was bounded only from
// below and truncated to int when the schedule was built (nl3000000000 reported as a negative
// count, nl2147483647 took a minute and 8 GB before any refusal); and the memory estimate could
// exceed 2^64 and wrap, bypassing --max-memory into std::bad_alloc. Problem::validate now bounds
// every field (int32 indices, nl <= 10^6) and the estimate saturates.
// Each must be refused at once with exit 2 naming the field or the limit.
TEST_CASE("hostile: problems beyond the size limits are refused at once naming the field") {
  const std::pair<const char*, const char*> cases[] = {
      {"sq4 skv8 hq1 dqk16 dv8 ih1 id16 k2 nl2147483647", "problem field nl"},
      {"sq4 skv8 hq1 dqk16 dv8 ih1 id16 k2 nl3000000000", "problem field nl"},
      {"sq4 skv8 hq1 dqk16 dv8 ih1 id16 k2 nl4294967297", "problem field nl"},
      {"sq1 skv1 hq1 dqk4000000000000000 dv1 nl2000", "problem field dqk"},
  };
  for (const auto& [p, needle] : cases) {
    CAPTURE(p);
    refused(cli(std::string("run --problem '") + p + "'", 10), {needle});
  }
}
