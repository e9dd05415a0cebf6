// Tests of query-row sampling (ref/inputs.h make_layer_inputs with rows, the CLI's --rows): the
// inputs and every output of a sampled stack equal the corresponding rows of the full problem,
// bit for bit, on ref and simd. The expected values are the full problem's own rows from the
// unsampled path, whose bytes are pinned independently by the checked-in golden sets (their
// replay must reproduce every SHA-256, tests/interop/test_goldens.py).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>
#include <vector>

#include "tests/cli_util.h"
#include "ref/indexer.h"
#include "ref/layer.h"
#include "ref/stack.h"
#include "ref/topk.h"
#include "simd/simd.h"
#include "tools/lib/golden.h"
#include "tools/lib/safetensors.h"

using namespace indexshare;

namespace {

// Row r of `sampled` must equal row rows[r] of `full` (both row-major, same trailing dims).
template <class T>
void check_rows_of(const Tensor<T>& full, const Tensor<T>& sampled, const std::vector<int64_t>& rows, const char* what) {
  CAPTURE(what);
  REQUIRE(full.rank() >= 1);
  Shape expect = full.shape;
  expect[0] = int64_t(rows.size());
  REQUIRE(sampled.shape == expect);
  const int64_t len = full.dim(0) ? full.numel() / full.dim(0) : 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    CAPTURE(r);
    CAPTURE(rows[r]);
    const auto a = full.data.begin() + rows[r] * len, b = sampled.data.begin() + int64_t(r) * len;
    if constexpr (std::is_same_v<T, float>) {  // bitwise, so that -0.0, +-inf and NaN count exactly
      bool same = true;
      for (int64_t i = 0; i < len && same; ++i) same = std::bit_cast<uint32_t>(a[i]) == std::bit_cast<uint32_t>(b[i]);
      CHECK(same);
    } else {
      CHECK(std::equal(a, a + len, b));
    }
  }
}

template <class T>
void check_same(const Tensor<T>& a, const Tensor<T>& b, const char* what) {
  CAPTURE(what);
  CHECK(a.shape == b.shape);
  CHECK(a.data == b.data);
}

void check_inputs(const ref::LayerInputs& full, const ref::LayerInputs& s, const std::vector<int64_t>& rows) {
  REQUIRE(full.has_indexer == s.has_indexer);
  check_rows_of(full.ks, s.ks, rows, "ks");
  check_rows_of(full.ke, s.ke, rows, "ke");
  if (full.has_indexer) {
    if (full.index_q8.numel()) {
      check_rows_of(full.index_q8, s.index_q8, rows, "indexer.q (fp8)");
      check_same(full.index_k8, s.index_k8, "indexer.k (fp8)");
    } else {
      check_rows_of(full.index_q, s.index_q, rows, "indexer.q (bf16)");
      check_same(full.index_k, s.index_k, "indexer.k (bf16)");
    }
    check_rows_of(full.index_q_scale, s.index_q_scale, rows, "indexer.q_scale");
    check_rows_of(full.index_weights, s.index_weights, rows, "indexer.weights");
    check_same(full.index_k_scale, s.index_k_scale, "indexer.k_scale");
  }
  check_rows_of(full.q, s.q, rows, "attn.q");
  check_same(full.kv, s.kv, "attn.kv");
  REQUIRE(full.sink.has_value() == s.sink.has_value());
  if (full.sink) check_same(*full.sink, *s.sink, "attn.sink");
}

void check_outputs(const std::vector<ref::StackLayerOutputs>& full, const std::vector<ref::StackLayerOutputs>& s,
                   const std::vector<int64_t>& rows) {
  REQUIRE(full.size() == s.size());
  for (size_t l = 0; l < full.size(); ++l) {
    CAPTURE(l);
    CHECK(full[l].kind == s[l].kind);
    CHECK(full[l].source == s[l].source);
    REQUIRE((full[l].logits.numel() > 0) == (s[l].logits.numel() > 0));
    if (full[l].logits.numel()) check_rows_of(full[l].logits, s[l].logits, rows, "logits");
    REQUIRE((full[l].own_topk.numel() > 0) == (s[l].own_topk.numel() > 0));
    if (full[l].own_topk.numel()) check_rows_of(full[l].own_topk, s[l].own_topk, rows, "own_topk");
    check_rows_of(full[l].used_topk, s[l].used_topk, rows, "used_topk");
    check_rows_of(full[l].indices, s[l].indices, rows, "indices");
    check_rows_of(full[l].attn.out, s[l].attn.out, rows, "attn.out");
    check_rows_of(full[l].attn.out_bf16, s[l].attn.out_bf16, rows, "attn.out_bf16");
    check_rows_of(full[l].attn.lse, s[l].attn.lse, rows, "attn.lse");
    check_rows_of(full[l].attn.max_logits, s[l].attn.max_logits, rows, "attn.max_logits");
  }
}

struct Case {
  const char* problem;
  std::vector<int64_t> rows;
};

}  // namespace

TEST_CASE("rows: generate_rows equals the rows of generate, rows straddling chunk boundaries") {
  // 7 x 9 x 13 = 819 values per row: rows straddle the 4096-value chunks at irregular offsets.
  const Problem p = parse_problem("sq8 skv8 seed5 dist=narrow");
  const Shape shape = {40, 9, 13};
  const Tensor<float> full = ref::generate(p, "layers.2.attn.q", shape, 0.75f);
  const std::vector<int64_t> rows = {39, 0, 5, 6, 7, 4, 20, 21, 38};
  check_rows_of(full, ref::generate_rows(p, "layers.2.attn.q", shape, rows, 0.75f), rows, "generate_rows");
  const std::vector<int64_t> all = {0, 1, 2, 3};
  check_rows_of(ref::generate(p, "x", {4, 3}), ref::generate_rows(p, "x", {4, 3}, all), all, "all rows");
  const std::vector<int64_t> bad = {40};
  CHECK_THROWS_AS(ref::generate_rows(p, "x", shape, bad), Error);
}

TEST_CASE("rows: sampled inputs and every stack output equal the full problem's rows (ref and simd)") {
  const std::vector<Case> cases = {
      // Two flattened sequences, recency and sinks, FP8, Full and Shared layers with own indexers.
      {"sq16 skv64 hq2 dqk64 dv32 ih4 id32 k8 seed3 nseq2 nl4 sched=FFSS recency=0.25 sinks=2", {15, 0, 8, 7, 3}},
      // Low similarity, ties, Shared layers without indexer inputs, random sinks; rows straddle
      // chunks (5 x 24 = 120 indexer values and 3 x 72 = 216 attention values per row).
      {"sq64 skv160 hq3 dqk72 dv40 ih5 id24 k12 seed4 nl5 sched=FSFSS sim=0.3 dist=ties own=no sink=random", {63, 1, 34, 35, 36, 2}},
      // bf16 indexer (HF), the GLM-5.2 schedule and a single row.
      {"sq20 skv48 hq2 dqk32 dv32 ih8 id16 k16 seed6 nl8 sched=glm-5.2 indexer=bf16 sim=0.9", {11}},
      // FP8 with the fp32_amax rule, narrow values (scales of close values), three sequences,
      // rows with windows shorter than top-k, a +inf sink.
      {"sq12 skv36 hq2 dqk16 dv16 ih3 id8 k10 seed8 nseq3 nl3 sched=FSF scale=fp32_amax dist=narrow sink=pinf recency=1 sinks=1",
       {0, 4, 8, 11, 3, 7}},
      // Every row, in reverse order.
      {"sq6 skv10 hq1 dqk8 dv8 ih2 id4 k3 seed9 nl2 sched=FS", {5, 4, 3, 2, 1, 0}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.problem);
    const Problem p = parse_problem(c.problem);
    const Schedule s = p.schedule();
    const auto full_in = ref::make_stack_inputs(p, s);
    const auto in = ref::make_stack_inputs(p, s, c.rows);
    REQUIRE(in.size() == full_in.size());
    for (size_t l = 0; l < in.size(); ++l) {
      CAPTURE(l);
      check_inputs(full_in[l], in[l], c.rows);
    }
    const auto full_out = ref::run_stack(p, s, full_in, true);
    check_outputs(full_out, ref::run_stack(p, s, in, true), c.rows);
    check_outputs(full_out, simd::run_stack(p, s, in, true), c.rows);
    // simd without logits: the streaming indexer + top-k (FP8) on the sampled rows.
    auto streamed = simd::run_stack(p, s, in, false);
    auto full_nolog = full_out;
    for (auto& o : full_nolog) o.logits = Tensor<float>();
    check_outputs(full_nolog, streamed, c.rows);
  }
}

TEST_CASE("rows: bad row lists are refused by name") {
  const Problem p = parse_problem("sq8 skv16 hq1 dqk8 dv8 ih2 id4 k3");
  const std::vector<int64_t> empty, out = {0, 8}, neg = {-1}, dup = {3, 1, 3};
  CHECK_THROWS_WITH_AS(ref::make_layer_inputs(p, 0, true, empty), doctest::Contains("empty"), Error);
  CHECK_THROWS_WITH_AS(ref::make_layer_inputs(p, 0, true, out), doctest::Contains("row 8 is outside [0, sq = 8)"), Error);
  CHECK_THROWS_WITH_AS(ref::make_layer_inputs(p, 0, true, neg), doctest::Contains("row -1 is outside"), Error);
  CHECK_THROWS_WITH_AS(ref::make_layer_inputs(p, 0, true, dup), doctest::Contains("row 3 is listed twice"), Error);
}

// ---- golden sets, diff and the CLI ------------------------------------------------------------

namespace {

namespace fs = std::filesystem;
using testing::run_cli;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() / ("indexshare-rows-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { std::error_code ec; fs::remove_all(path, ec); }
  static int& counter() { static int c = 0; return c; }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Key-side tensors are stored whole in a sampled set; everything else row by row.
bool key_side(const std::string& name) {
  for (const char* k : {".indexer.k", ".indexer.k_scale", ".attn.kv", ".attn.sink"})
    if (name.size() > std::strlen(k) && name.compare(name.size() - std::strlen(k), std::string::npos, k) == 0) return true;
  return name == "cu_seqlens_k";
}

}  // namespace

TEST_CASE("rows: golden --rows stores exactly the full set's rows, replays bit for bit, and diff judges it") {
  TmpDir tmp;
  const std::string P = "sq16 skv64 hq2 dqk64 dv32 ih4 id32 k8 seed3 nseq2 nl4 sched=FFSS recency=0.25 sinks=2 sink=random";
  const std::string full = (tmp.path / "full").string(), samp = (tmp.path / "samp").string();
  REQUIRE(run_cli("golden --problem '" + P + "' --out " + full).status == 0);
  auto r = run_cli("golden --problem '" + P + "' --rows 15,3,7-8,last:1 --out " + samp);
  REQUIRE(r.status == 2);  // row 15 twice (15 and last:1)
  CHECK(r.out.find("--rows: item 'last:1'") != std::string::npos);
  CHECK(!fs::exists(samp));
  r = run_cli("golden --problem '" + P + "' --rows 15,3,7-8 --out " + samp);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("--kind stack --rows 15,3,7-8 --out " + samp) != std::string::npos);

  const golden::Loaded f = golden::read(full), s = golden::read(samp);
  const std::vector<int64_t> rows = {15, 3, 7, 8};
  CHECK(s.manifest["config"]["s_q"] == 4);
  CHECK(s.manifest["rows"]["list"] == "15,3,7-8");
  CHECK(s.manifest["rows"]["problem_s_q"] == 16);
  CHECK(s.manifest["problem"] == f.manifest["problem"]);
  const Tensor<int32_t> rt = s.tensor<int32_t>("rows");
  CHECK(std::vector<int64_t>(rt.data.begin(), rt.data.end()) == rows);
  CHECK(s.find("cu_seqlens_q") == nullptr);
  int compared = 0;
  for (const io::TensorView& v : s.data.tensors) {
    if (v.name == "rows") continue;
    CAPTURE(v.name);
    const io::TensorView& w = f.get(v.name);
    REQUIRE(v.dtype == w.dtype);
    if (key_side(v.name)) {
      CHECK(v.shape == w.shape);
      CHECK(v.bytes == w.bytes);
    } else {
      Shape expect = w.shape;
      expect[0] = 4;
      REQUIRE(v.shape == expect);
      const size_t len = w.bytes.size() / size_t(w.shape[0]);
      for (size_t i = 0; i < rows.size(); ++i)
        CHECK(std::equal(v.bytes.begin() + i * len, v.bytes.begin() + (i + 1) * len, w.bytes.begin() + rows[i] * len));
    }
    ++compared;
  }
  CHECK(compared == int(f.data.tensors.size()) - 1);  // everything but cu_seqlens_q

  // The replay line regenerates identical bytes; --impl simd writes the same bytes as ref.
  std::string replay = s.manifest["replay"];
  replay = replay.substr(std::string("indexshare ").size());
  replay.replace(replay.find("--out " + samp), std::string("--out " + samp).size(), "--out " + (tmp.path / "again").string());
  REQUIRE(run_cli(replay).status == 0);
  CHECK(read_file(tmp.path / "again" / "tensors.safetensors") == read_file(tmp.path / "samp" / "tensors.safetensors"));
  REQUIRE(run_cli("golden --impl simd --problem '" + P + "' --rows 15,3,7-8 --out " + (tmp.path / "simd").string()).status == 0);
  CHECK(read_file(tmp.path / "simd" / "tensors.safetensors") == read_file(tmp.path / "samp" / "tensors.safetensors"));

  // diff: the golden's own outputs pass; a candidate shaped like the full problem is refused (2);
  // a Shared layer on the wrong Full layer's positions, and a top-k of windows one key too short
  // (computed here from the sampled rows' own ks/ke), fail and are diagnosed.
  std::vector<io::TensorView> cand;
  for (int l = 0; l < 4; ++l)
    for (const char* n : {"indexer.logits", "indexer.topk", "attn.indices", "attn.out", "attn.lse", "attn.max_logits"})
      if (const io::TensorView* v = s.find("layers." + std::to_string(l) + "." + n)) cand.push_back(*v);
  const std::string cpath = (tmp.path / "cand.safetensors").string();
  io::write_safetensors(cpath, cand, {});
  r = run_cli("diff --golden " + samp + " --candidate " + cpath);
  CHECK(r.status == 0);
  CHECK(r.out.find("failed:0") != std::string::npos);
  io::write_safetensors(cpath, {f.get("layers.0.attn.out")}, {});
  r = run_cli("diff --golden " + samp + " --candidate " + cpath);
  CHECK(r.status == 2);
  // Layer 2 (Shared, source 1) handed layer 0's positions.
  io::TensorView wrong = s.get("layers.0.attn.indices");
  wrong.name = "layers.2.attn.indices";
  io::write_safetensors(cpath, {wrong}, {});
  r = run_cli("diff --golden " + samp + " --candidate " + cpath);
  CHECK(r.status == 1);
  CHECK(r.out.find("Full layer 0's positions instead of layer 1's") != std::string::npos);
  // Layer 1's top-k over [ks, ke - 1): causal off by one, in the sampled rows' windows.
  const Tensor<int32_t> ks = s.tensor<int32_t>("layers.1.indexer.ks");
  Tensor<int32_t> ke = s.tensor<int32_t>("layers.1.indexer.ke");
  for (int32_t& v : ke.data) v -= 1;
  const Tensor<float> l2 = ref::indexer_logits_fp8(s.tensor<e4m3_t>("layers.1.indexer.q"), s.tensor<e4m3_t>("layers.1.indexer.k"),
                                                   s.tensor<float>("layers.1.indexer.k_scale"), s.tensor<float>("layers.1.indexer.weights"), ks, ke);
  io::write_safetensors(cpath, {io::make_view("layers.1.indexer.topk", ref::topk(l2, ks, ke, 8))}, {});
  r = run_cli("diff --golden " + samp + " --candidate " + cpath);
  CHECK(r.status == 1);
  CHECK(r.out.find("one key too short") != std::string::npos);
  // The simd kernels recompute the same expectations: the same report, word for word.
  const auto rs = run_cli("diff --impl simd --golden " + samp + " --candidate " + cpath);
  CHECK(rs.status == r.status);
  CHECK(rs.out == r.out);
  CHECK(run_cli("diff --impl fast --golden " + samp + " --candidate " + cpath).status == 2);

  // overlap needs every row: a sampled set is refused by name.
  r = run_cli("overlap --golden " + samp);
  CHECK(r.status == 2);
  CHECK(r.out.find("sampled query rows") != std::string::npos);
  // A manifest whose row list disagrees with the tensor is refused.
  {
    std::string m = read_file(tmp.path / "samp" / "manifest.json");
    m.replace(m.find("\"15,3,7-8\""), 10, "\"15,3,7-9\"");
    std::ofstream(tmp.path / "samp" / "manifest.json") << m;
  }
  r = run_cli("verify --golden " + samp);
  CHECK(r.status == 2);
  CHECK(r.out.find("field 'rows.list'") != std::string::npos);
}

TEST_CASE("rows: run --rows, bad lists and the memory estimate of sampled long contexts") {
  const std::string P = "--problem 'sq16 skv64 hq2 dqk64 dv32 ih4 id32 k8 seed3 nseq2 nl2 sched=FS'";
  auto r = run_cli("run --impl ref " + P + " --rows every:5,1");
  CHECK(r.status == 0);
  CHECK(r.out.find("rows      5 of 16 query rows: 0,5,10,15,1") != std::string::npos);
  CHECK(r.out.find("--rows 0,5,10,15,1\n") != std::string::npos);
  for (const char* bad : {"''", "16", "3,3", "5-2", "last:0", "last:17", "every:x", "first:2", "1,,2", "-1"}) {
    CAPTURE(bad);
    r = run_cli("run " + P + " --rows " + bad);
    CHECK(r.status == 2);
    CHECK(r.out.find("--rows") != std::string::npos);
  }
  CHECK(run_cli("run --model tiny-glm --rows 0").status == 2);
  TmpDir tmp;
  r = run_cli("golden --problem 'sq8 skv40' --kind attention-edge --rows 0 --out " + (tmp.path / "e").string());
  CHECK(r.status == 2);
  CHECK(r.out.find("--rows") != std::string::npos);
  CHECK(!fs::exists(tmp.path / "e"));
  // 1M keys, 64 sampled rows, 1 layer: about 1.3 GB of key-side tensors (kv 1M x 576 bf16 =
  // 1.2 GB, indexer k 1M x 132 B) and 256 MB of logits; all 1M rows would need terabytes.
  const std::string big = "--problem 'sq1048576 skv1048576 hq16 dqk576 dv512 ih64 id128 k2048' ";
  r = run_cli("run " + big + "--rows last:64 --max-memory 1K");
  CHECK(r.status == 2);
  const size_t at = r.out.find("needs about ");
  REQUIRE(at != std::string::npos);
  const double gb = std::stod(r.out.substr(at + 12));
  CHECK(gb > 1.2);
  CHECK(gb < 2.0);
  CHECK(r.out.find("64 query rows") != std::string::npos);
  r = run_cli("golden " + big + "--rows last:64 --max-memory 1K --out " + (tmp.path / "m").string());
  CHECK(r.status == 2);
  const double gb_golden = std::stod(r.out.substr(r.out.find("needs about ") + 12));
  CHECK(gb_golden > 2.5);  // logits kept and every tensor copied once more for the file
  CHECK(gb_golden < 4.0);
  r = run_cli("run " + big + "--max-memory 64G");
  CHECK(r.status == 2);  // every row: far above any budget
  CHECK(r.out.find("1048576 query rows") != std::string::npos);
}
