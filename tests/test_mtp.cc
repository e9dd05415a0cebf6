// MTP draft steps that share the top-k (ref/mtp.h), their golden sets (golden --kind mtp,
// tools/lib/golden_mtp.h) and diff on them (judge/mtp.cc). Expected values come from brute force:
// compaction rows and positions written out by hand, the draft steps' attention against dense
// attention over the positions <= p (a full causal row), the set's rows against its own layer 1.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ref/mtp.h"
#include "ref/rng.h"
#include "tests/candidate_util.h"
#include "tests/cli_util.h"
#include "tests/simd_targets.h"
#include "tools/judge/diff.h"
#include "tools/lib/golden_mtp.h"

using namespace indexshare;
namespace fs = std::filesystem;

namespace {

using indexshare::testing::file_bytes;
using indexshare::testing::diagnosed;
using indexshare::testing::diagnoses_text;
std::string tmp(const std::string& tag) { return indexshare::testing::temp_path("mtp", tag); }

const char* kSpec = "sq16 skv128 hq4 dqk64 dv32 ih4 id32 k8 seed61 nseq4 steps=4 accept=4,1,3,2";

ref::mtp::Draft example() {
  ref::mtp::Draft d;
  d.rows = 4;
  d.start = 12;
  d.accepted = {4, 1, 3, 2};
  d.steps = 3;
  return d;
}

// Random bf16 values from the project's generator.
Tensor<bf16_t> random_bf16(const Shape& shape, uint64_t seed, const std::string& stream) {
  Tensor<bf16_t> y(shape);
  indexshare::fill_range_bf16(y.data.data(), 0, y.numel(), Dist::normal, 1.0f, seed, stream_tag(stream));
  return y;
}

struct Set {
  std::string dir;
  golden::Loaded g;
  explicit Set(const std::string& spec = kSpec, Impl impl = Impl::ref) : dir(tmp("set")) {
    golden::write(dir, golden::build_mtp(golden::parse_mtp_spec(spec), "r", impl), false);
    g = golden::read(dir);
  }
  ~Set() { fs::remove_all(dir); }
};

// Rows `src` of t, in order (the test's own gather).
Tensor<int32_t> rows_of(const Tensor<int32_t>& t, const std::vector<int64_t>& src) {
  const int64_t w = t.numel() / t.dim(0);
  Shape s = t.shape;
  s[0] = int64_t(src.size());
  Tensor<int32_t> out(s);
  for (size_t i = 0; i < src.size(); ++i)
    for (int64_t j = 0; j < w; ++j) out[int64_t(i) * w + j] = t[src[i] * w + j];
  return out;
}

}  // namespace

TEST_CASE("mtp: compaction keeps each request's last accepted row, and the draft steps reuse it unchanged") {
  const ref::mtp::Draft d = example();
  CHECK(ref::mtp::last_accepted_rows(d) == std::vector<int64_t>{3, 4, 10, 13});
  Tensor<int32_t> step0({16, 1, 3});
  for (int64_t i = 0; i < step0.numel(); ++i) step0[i] = int32_t(i);
  step0[4 * 3 + 2] = -1;  // request 1's row keeps its padding
  const Tensor<int32_t> rows = ref::mtp::draft_rows(step0, d);
  CHECK(rows.shape == Shape{8, 1, 3});
  const int32_t want[8][3] = {{9, 10, 11}, {12, 13, -1}, {30, 31, 32}, {39, 40, 41},
                              {9, 10, 11}, {12, 13, -1}, {30, 31, 32}, {39, 40, 41}};
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t j = 0; j < 3; ++j) CHECK(rows[r * 3 + j] == want[r][j]);
  // Positions: p_r = 12 + accepted - 1 = 15, 12, 14, 13, then + i for step i.
  const Tensor<int32_t> pos = ref::mtp::draft_positions(d);
  CHECK(pos.data == std::vector<int32_t>{16, 13, 15, 14, 17, 14, 16, 15});
}

TEST_CASE("mtp: a draft beyond the drafted tokens, without a request's length, or with one step is refused by field") {
  ref::mtp::Draft d = example();
  CHECK_NOTHROW(ref::mtp::check_draft(d, 4));
  d.accepted[1] = 5;
  CHECK_THROWS_WITH_AS(ref::mtp::check_draft(d, 4),
                       "mtp field 'accept': request 1 accepts 5 tokens, beyond the 4 drafted tokens its draft extend holds "
                       "(sq / nseq rows per request)", Error);
  d.accepted[1] = 0;
  CHECK_THROWS_WITH_AS(ref::mtp::check_draft(d, 4), doctest::Contains("request 1 accepts 0 tokens: at least 1"), Error);
  d = example();
  CHECK_THROWS_WITH_AS(ref::mtp::check_draft(d, 3), doctest::Contains("mtp field 'accept': 4 accepted lengths for 3 requests"), Error);
  d.steps = 1;
  CHECK_THROWS_WITH_AS(ref::mtp::check_draft(d, 4), doctest::Contains("mtp field 'steps': 1 draft steps"), Error);
}

// With every causal key in each step-0 row, a draft step's attention is dense attention over the
// positions <= p_r of its request (sparse selecting every key equals dense bit for bit): the reused
// row holds no draft token.
TEST_CASE("mtp: the draft steps' attention is dense attention over the positions <= p of the last accepted token") {
  const ref::mtp::Draft d = example();
  const int64_t R = 4, Lk = 16, k = Lk, h = 2, dqk = 32, dv = 16;
  Tensor<int32_t> step0({R * d.rows, 1, k}, -1);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < d.rows; ++j)
      for (int64_t s = 0; s <= d.start + j; ++s) step0[(r * d.rows + j) * k + s] = int32_t(r * Lk + s);
  const Tensor<bf16_t> kv = random_bf16({R * Lk, 1, dqk}, 5, "kv");
  const Tensor<bf16_t> q = random_bf16({(d.steps - 1) * R, h, dqk}, 5, "q");
  const Tensor<float> sink({h}, 0.25f);
  const ref::AttentionOut got = ref::mtp::draft_attention(q, kv, step0, d, 0.125f, dv, &sink);
  Tensor<int32_t> ks({(d.steps - 1) * R}), ke({(d.steps - 1) * R});
  for (int64_t i = 1; i < d.steps; ++i)
    for (int64_t r = 0; r < R; ++r) {
      ks[(i - 1) * R + r] = int32_t(r * Lk);
      ke[(i - 1) * R + r] = int32_t(r * Lk + d.start + d.accepted[size_t(r)]);  // positions 0 .. p_r
    }
  const ref::AttentionOut want = ref::dense_attention(q, kv, 0.125f, dv, ks, ke, &sink);
  CHECK(simd_test::first_diff(got.out, want.out) == -1);
  CHECK(simd_test::first_diff(got.lse, want.lse) == -1);
  CHECK(simd_test::first_diff(got.max_logits, want.max_logits) == -1);
  simd_test::for_each_target([&](const std::string&, int) {
    const ref::AttentionOut s = ref::mtp::draft_attention(q, kv, step0, d, 0.125f, dv, &sink, simd::kernels());
    CHECK(simd_test::first_diff(s.out, got.out) == -1);
    CHECK(simd_test::first_diff(s.lse, got.lse) == -1);
    CHECK(simd_test::first_diff(s.max_logits, got.max_logits) == -1);
  });
}

TEST_CASE("mtp golden: the descriptor parses and prints canonically, and a bad field is refused by name") {
  const golden::MtpSpec s = golden::parse_mtp_spec("nseq4 sq16 skv128 hq4 dqk64 dv32 ih4 id32 k8 seed61 accept=4,1,3,2 steps=4");
  CHECK(golden::to_string(s) == "sq16 skv128 hq4 dqk64 dv32 ih4 id32 k8 seed61 nl2 nseq4 steps=4 accept=4,1,3,2");
  CHECK(s.draft.rows == 4);
  CHECK(s.draft.start == 28);
  const std::pair<std::string, std::string> bad[] = {
      {"sq16 skv128 k8 nseq4 steps=4 accept=4,1,5,2", "mtp field 'accept': request 2 accepts 5 tokens, beyond the 4 drafted"},
      {"sq16 skv128 k8 nseq4 steps=4 accept=4,1,3", "mtp field 'accept': 3 accepted lengths for 4 requests"},
      {"sq16 skv128 k8 nseq4 steps=x accept=4,1,3,2", "mtp field 'steps': 'x' is not a non-negative integer"},
      {"sq16 skv128 k8 nseq4 accept=4,1,3,2", "mtp field 'steps' is missing"},
      {"sq16 skv128 k8 nseq4 steps=2", "mtp field 'accept' is missing"},
      {"sq16 skv128 k8 nseq4 nl2 sched=FS steps=2 accept=1,1,1,1", "mtp: the set holds 2 Full layers"},
      {"sq16 skv128 k8 nseq4 nl3 steps=2 accept=1,1,1,1", "got nl3"}};
  for (const auto& [spec, want] : bad) CHECK_THROWS_WITH_AS(golden::parse_mtp_spec(spec), doctest::Contains(want.c_str()), Error);
}

TEST_CASE("mtp golden: the set's draft rows are layer 1's at the last accepted rows, and ref = simd byte for byte") {
  const Set set;
  const golden::Loaded& g = set.g;
  CHECK(g.manifest["kind"] == "mtp");
  CHECK(g.manifest["mtp"]["last_rows"] == nlohmann::json::array({3, 4, 10, 13}));
  std::vector<int64_t> src;
  for (int i = 1; i < 4; ++i)
    for (int64_t r : {3, 4, 10, 13}) src.push_back(r);
  CHECK(g.tensor<int32_t>("mtp.indices").data == rows_of(g.tensor<int32_t>("layers.1.attn.indices"), src).data);
  CHECK(g.tensor<int32_t>("mtp.topk").data == rows_of(g.tensor<int32_t>("layers.1.indexer.topk"), src).data);
  // The target's rows differ from the MTP layer's (else the planted mistake below proves nothing).
  CHECK(rows_of(g.tensor<int32_t>("layers.0.attn.indices"), src).data != g.tensor<int32_t>("mtp.indices").data);
  const Set simd(kSpec, Impl::simd);
  CHECK(g.manifest["tensors"] == simd.g.manifest["tensors"]);  // every tensor's SHA-256
  CHECK(file_bytes(set.dir + "/tensors.safetensors") == file_bytes(simd.dir + "/tensors.safetensors"));
}

namespace {

const std::vector<int64_t> kLast = {3, 4, 10, 13}, kPadded = {3, 7, 11, 15};

std::vector<int64_t> draft_src(const std::vector<int64_t>& rows) {
  std::vector<int64_t> src;
  for (int i = 1; i < 4; ++i) src.insert(src.end(), rows.begin(), rows.end());
  return src;
}

// The golden's own step 0 (layer 1's top-k and indices) and draft steps as a candidate.
testing::Candidate own(const golden::Loaded& g) {
  testing::Candidate c;
  for (const char* n : {"layers.1.indexer.topk", "layers.1.attn.indices", "mtp.topk", "mtp.indices"}) c.set(n, g.tensor<int32_t>(n));
  for (const char* n : {"mtp.out", "mtp.lse", "mtp.max_logits"}) c.set(n, g.tensor<float>(n));
  return c;
}

// A kernel that computes honestly on the wrong rows: the draft steps' rows and their attention.
void draft_over(const golden::Loaded& g, testing::Candidate& c, const Tensor<int32_t>& rows) {
  c.set("mtp.indices", rows);
  const ref::AttentionOut a = ref::sparse_attention(g.tensor<bf16_t>("mtp.q"), g.tensor<bf16_t>("layers.1.attn.kv"), rows,
                                                    g.manifest["config"]["sm_scale"].get<float>(), 32);
  c.set("mtp.out", a.out);
  c.set("mtp.lse", a.lse);
  c.set("mtp.max_logits", a.max_logits);
  c.t.erase("mtp.topk");
}

std::string verdict(const diff::Result& r, int layer, const std::string& name) {
  for (const diff::TensorResult& t : r.tensors)
    if (t.layer == layer && t.name == name) return cmp::verdict_name(t.report.verdict);
  return "(not judged)";
}

}  // namespace

TEST_CASE("mtp diff: the golden's own draft steps and a slot permutation pass, planted mistakes fail with their names") {
  const Set set;
  const golden::Loaded& g = set.g;
  testing::Candidate c = own(g);
  diff::Result r = diff::judge(g, c.file(), {});
  CHECK_MESSAGE(!r.failed(), r.text("x"));
  for (const char* n : {"mtp.topk", "mtp.indices", "mtp.out", "mtp.lse", "mtp.max_logits"}) CHECK(verdict(r, 1, n) == "PASS");
  CHECK(verdict(r, 1, "attn.indices") == "PASS");
  // Slot order carries no meaning.
  Tensor<int32_t> rev = g.tensor<int32_t>("mtp.indices");
  for (int64_t t = 0; t < rev.dim(0); ++t) std::reverse(rev.data.begin() + t * 8, rev.data.begin() + (t + 1) * 8);
  c.set("mtp.indices", rev);
  r = diff::judge(g, c.file(), {});
  CHECK_MESSAGE(!r.failed(), r.text("x"));

  // The target's top-k where the MTP layer's own belongs: in the draft steps' rows ...
  const std::string target = "a draft step using the target's top-k", padded = "the last padded row instead of the last accepted row";
  c = own(g);
  draft_over(g, c, rows_of(g.tensor<int32_t>("layers.0.attn.indices"), draft_src(kLast)));
  r = diff::judge(g, c.file(), {});
  CHECK(verdict(r, 1, "mtp.indices") == "FAIL");
  CHECK(verdict(r, 1, "mtp.out") == "FAIL");
  CHECK_MESSAGE(diagnosed(r, "draft steps: " + target + ": mtp.indices"), diagnoses_text(r));
  CHECK_MESSAGE(diagnosed(r, "draft steps: " + target + ": mtp.out"), diagnoses_text(r));
  CHECK_MESSAGE(!diagnosed(r, padded), diagnoses_text(r));
  // ... the attention alone names it too ...
  c.t.erase("mtp.indices");
  r = diff::judge(g, c.file(), {});
  CHECK(verdict(r, 1, "mtp.out") == "FAIL");
  CHECK_MESSAGE(diagnosed(r, "draft steps: " + target + ": mtp.out"), diagnoses_text(r));
  // ... and at step 0 (layer 1 running the target's top-k instead of its own indexer).
  c = own(g);
  c.set("layers.1.indexer.topk", g.tensor<int32_t>("layers.0.indexer.topk"));
  c.set("layers.1.attn.indices", g.tensor<int32_t>("layers.0.attn.indices"));
  r = diff::judge(g, c.file(), {});
  CHECK(verdict(r, 1, "indexer.topk") == "FAIL");
  CHECK_MESSAGE(diagnosed(r, "layer 1: " + target + " at draft step 0: layers.1.indexer.topk"), diagnoses_text(r));
  CHECK_MESSAGE(diagnosed(r, "layer 1: " + target + " at draft step 0: layers.1.attn.indices"), diagnoses_text(r));

  // Compaction by the last padded row of each request's draft extend.
  c = own(g);
  draft_over(g, c, rows_of(g.tensor<int32_t>("layers.1.attn.indices"), draft_src(kPadded)));
  r = diff::judge(g, c.file(), {});
  CHECK(verdict(r, 1, "mtp.indices") == "FAIL");
  CHECK_MESSAGE(diagnosed(r, "draft steps: " + padded + ": mtp.indices"), diagnoses_text(r));
  CHECK_MESSAGE(diagnosed(r, "draft steps: " + padded + ": mtp.out"), diagnoses_text(r));
  CHECK_MESSAGE(!diagnosed(r, target), diagnoses_text(r));

  // A row grown by the draft tokens (position p + 1 added) fails without a named mistake.
  c = own(g);
  Tensor<int32_t> grown = g.tensor<int32_t>("mtp.indices");
  const Tensor<int32_t> pos = g.tensor<int32_t>("mtp.positions");
  for (int64_t t = 0; t < grown.dim(0); ++t) grown[t * 8] = int32_t((t % 4) * 32 + pos[t % 4]);  // the first draft token
  c.set("mtp.indices", grown);
  r = diff::judge(g, c.file(), {});
  CHECK(verdict(r, 1, "mtp.indices") == "FAIL");
  // A mis-shaped draft tensor is bad input.
  c = own(g);
  c.set("mtp.lse", Tensor<float>({3, 4}, 0.0f));
  CHECK_THROWS_AS(diff::judge(g, c.file(), {}), Error);
}

TEST_CASE("mtp golden: golden::read refuses a bad mtp block naming the field") {
  const Set set;
  const std::string mpath = set.dir + "/manifest.json";
  const nlohmann::json original = set.g.manifest;
  const std::pair<std::function<void(nlohmann::json&)>, std::string> cases[] = {
      {[](nlohmann::json& m) { m.erase("mtp"); }, "field 'mtp' is missing"},
      {[](nlohmann::json& m) { m["mtp"]["accepted"] = {4, 5, 3, 2}; }, "request 1 accepts 5 tokens, beyond the 4 drafted"},
      {[](nlohmann::json& m) { m["mtp"]["last_rows"] = {3, 7, 11, 15}; }, "field 'mtp.last_rows'"},
      {[](nlohmann::json& m) { m["mtp"]["steps"] = 3; }, "field 'mtp.steps' and mtp.accepted give 8 rows, but tensor 'mtp.q' is [12,4,64]"},
      {[](nlohmann::json& m) { m["kind"] = "stack"; }, "is 'stack', but the set holds tensor 'mtp."}};
  for (const auto& [edit, want] : cases) {
    nlohmann::json m = original;
    edit(m);
    std::ofstream(mpath) << m.dump(2);
    CHECK_THROWS_WITH_AS(golden::read(set.dir), doctest::Contains(want.c_str()), Error);
  }
}

TEST_CASE("mtp golden: the CLI writes and judges a set, a draft beyond the drafted tokens exits 2 and writes nothing") {
  const std::string dir = tmp("cli");
  auto r = testing::run_cli("golden --kind mtp --problem 'sq16 skv128 hq4 dqk64 dv32 ih4 id32 k8 nseq4 steps=3 accept=4,1,5,2' --out " + dir);
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("mtp field 'accept': request 2 accepts 5 tokens, beyond the 4 drafted tokens") != std::string::npos, r.out);
  CHECK(!fs::exists(dir));
  r = testing::run_cli("golden --preset mtp-tiny --out " + dir);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(testing::run_cli("verify --golden " + dir).status == 0);
  const golden::Loaded g = golden::read(dir);
  const std::string cand = dir + "-cand.safetensors";
  std::vector<io::TensorView> views;
  for (const char* n : {"mtp.indices", "mtp.out", "mtp.lse"}) views.push_back(g.get(n));
  io::write_safetensors(cand, views);
  r = testing::run_cli("diff --golden " + dir + " --candidate " + cand);
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK_MESSAGE(r.out.find("layer  1 mtp.indices      PASS") != std::string::npos, r.out);
  // The checked-in set regenerates bit for bit.
  const std::string src = std::string(INDEXSHARE_SOURCE_DIR) + "/golden/mtp-tiny";
  CHECK(file_bytes(dir + "/tensors.safetensors") == file_bytes(src + "/tensors.safetensors"));
  nlohmann::json want = nlohmann::json::parse(file_bytes(src + "/manifest.json"));
  nlohmann::json got = g.manifest;
  CHECK(want["replay"] == "indexshare golden --kind mtp --problem \"" + golden::to_string(golden::parse_mtp_spec(kSpec)) +
                              "\" --out golden/mtp-tiny");
  want.erase("replay");
  got.erase("replay");
  CHECK(want == got);
  fs::remove_all(dir);
  fs::remove(cand);
}
