// Diagnosis accuracy: every planted bug of the catalogue (tools/judge/calibrate.h) fails and is
// named by its own hypothesis first, and every hypothesis of the registry (tools/judge/diff.h) has
// its planted bug there.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "ref/error.h"
#include "simd/simd.h"
#include "tools/judge/calibrate.h"
#include "tools/judge/diff.h"

using namespace indexshare;

TEST_CASE("catalogue: every planted kernel bug fails and its first diagnosis names it") {
  const std::string tmp = (std::filesystem::temp_directory_path() / ("indexshare-catalogue-" + std::to_string(::getpid()))).string();
  const std::vector<calib::CatalogueRow> rows = calib::catalogue(simd::kernels(), tmp);
  std::filesystem::remove_all(tmp);
  CHECK(rows.size() >= 25);
  std::set<std::string> bugs;
  for (const calib::CatalogueRow& r : rows) {
    CAPTURE(r.bug);
    CAPTURE(r.first);
    CHECK(r.failed);
    CHECK(r.named_first);
    bugs.insert(r.bug);
  }
  // The registry's hypotheses each have their planted bug in the catalogue (or in the fault suite).
  for (const diff::Hypothesis& h : diff::hypotheses()) {
    CAPTURE(h.name);
    if (!h.planted.empty()) CHECK(bugs.count(h.planted) == 1);
  }
}

namespace {

// calib::catalogue_preset in a scratch folder of its own, removed after.
std::vector<calib::CatalogueRow> preset_rows(const std::string& preset) {
  const std::string tmp = (std::filesystem::temp_directory_path() / ("indexshare-catalogue-preset-" + std::to_string(::getpid()))).string();
  struct Cleanup { std::string d; ~Cleanup() { std::error_code ec; std::filesystem::remove_all(d, ec); } } cleanup{tmp};
  return calib::catalogue_preset(preset, simd::kernels(), tmp);
}

}  // namespace

// Power per kernel preset: the stack catalogue planted on DeepGEMM's FP8 logits preset. The kernel
// writes indexer.logits alone: the four bugs that show there fail, named (bf16 logits, a scale, a
// lane's scale, and top-k from bf16 scores through its logits), and every other bug is n/a (an
// attention bug changes tensors it does not write, a Shared-layer bug needs layers it lacks).
TEST_CASE("catalogue: --preset plants the bugs a kernel can have on its preset") {
  const std::vector<calib::CatalogueRow> rows = preset_rows("deepgemm-fp8-mqa-logits-sm90");
  std::map<std::string, int> n;
  for (const calib::CatalogueRow& r : rows) {
    CAPTURE(r.bug);
    CAPTURE(r.first);
    ++n[r.outcome()];
    if (r.bug.rfind("indexer logits", 0) == 0) CHECK(r.outcome() == "right");
    if (r.bug.rfind("attn.", 0) == 0 || r.bug.rfind("Shared", 0) == 0) CHECK(r.outcome() == "n/a");
  }
  CHECK(n["right"] == 4);
  CHECK(n["n/a"] == 23);
  CHECK_THROWS_AS(preset_rows("glm-5.2"), Error);
}

// Every bug the kernel can have fails, named, and nothing else: the outcomes of one preset.
std::map<std::string, int> outcomes(const std::vector<calib::CatalogueRow>& rows) {
  std::map<std::string, int> n;
  for (const calib::CatalogueRow& r : rows) {
    CAPTURE(r.bug);
    CAPTURE(r.first);
    ++n[r.outcome()];
    CHECK((r.outcome() == "right" || r.outcome() == "n/a"));
  }
  return n;
}

// FlashMLA's MODEL1 two-scope decode preset (16 query rows, a strong sink, kv ~ N(0, 1), one
// sequence's rows empty; about 15 s): the stack catalogue's attention bugs and the index mapping's
// four (each length ignored, the extra scope left out, its slots read without the main_slots
// offset), each named by its own hypothesis. On the earlier 4-row preset with FlashMLA's kv / 10 a
// head's scale and bf16 q.k logits passed, and the mapping's bugs were named a scale or truncation.
TEST_CASE("catalogue: --preset flashmla-sparse-decode-model1: every bug the kernel can have, named") {
  const std::vector<calib::CatalogueRow> rows = preset_rows("flashmla-sparse-decode-model1");
  const std::map<std::string, int> n = outcomes(rows);
  CHECK(n.at("right") == 20);
  int model1 = 0;
  for (const calib::CatalogueRow& r : rows) model1 += r.bug.rfind("MODEL1: ", 0) == 0 && r.outcome() == "right";
  CHECK(model1 == 4);
}

// The slow tier (build/indexshare_tests -tc='catalogue: slow:*' --no-skip): the MODEL1 prefill preset
// (16 rows, 30 s) and the training presets (TileLang's backward, 2 min; Megatron's loss, 25 s).
TEST_CASE("catalogue: slow: --preset on flashmla-sparse-prefill-model1" * doctest::skip()) {
  const std::map<std::string, int> n = outcomes(preset_rows("flashmla-sparse-prefill-model1"));
  CHECK(n.at("right") == 17);
}

TEST_CASE("catalogue: slow: --preset on the training presets" * doctest::skip()) {
  const std::map<std::string, int> bwd = outcomes(preset_rows("tilelang-sparse-mla-bwd"));
  CHECK(bwd.at("right") == 5);  // dq scaled, sm_scale twice, dkv without V, -1 read as a key, bf16 accumulation
  const std::map<std::string, int> loss = outcomes(preset_rows("megatron-dsa-indexer-loss"));
  CHECK(loss.at("right") == 4);  // dq scaled, per-token loss, no ReLU and dense support (both unnamed)
}

TEST_CASE("catalogue: wrong names are counted apart from missing ones") {
  calib::CatalogueRow r{"bug", "softmax scale", "", true, false, false, ""};
  CHECK(r.outcome() == "missing");
  r.first = "layer 3: a Shared C4A layer whose blocks are not its source layer 1's";
  CHECK(r.outcome() == "wrong");
  r.named_first = true;
  CHECK(r.outcome() == "right");
  r.failed = false;
  CHECK(r.outcome() == "passed");
}

TEST_CASE("catalogue: a report with no named cause lists the registry's hypotheses") {
  diff::Result r;
  r.tensors.push_back({0, "attn.out", {}, ""});
  r.tensors.back().report.verdict = cmp::Verdict::fail;
  const std::string text = r.text("x");
  CHECK(text.find("no named hypothesis explains the failure (tested: ") != std::string::npos);
  for (const diff::Hypothesis& h : diff::hypotheses()) CHECK(text.find(h.name) != std::string::npos);
}
