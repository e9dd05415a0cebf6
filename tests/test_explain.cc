// Tests of `indexshare explain` (tools/lib/explain.h) on the checked-in golden sets: every number it
// prints is checked against the set's own tensors.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "ref/numerics.h"
#include "tests/cli_util.h"
#include "tools/lib/explain.h"

using namespace indexshare;

namespace {

std::string golden_dir(const std::string& name) { return std::string(INDEXSHARE_SOURCE_DIR) + "/golden/" + name; }
std::string g7(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%-13.7g", v);
  return b;
}
bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// The candidate file of `views`, removed at the end of the scope.
struct TmpCandidate {
  std::string path;
  explicit TmpCandidate(const std::vector<io::TensorView>& views)
      : path((std::filesystem::temp_directory_path() / ("indexshare-explain-" + std::to_string(::getpid()) + ".safetensors")).string()) {
    io::write_safetensors(path, views);
  }
  ~TmpCandidate() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("explain: a Shared layer's row — window, the source's logits and k-th score, positions, recall, attention") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
  explain::Options o;
  o.layer = 3;  // Shared, source 2
  o.row = 15;
  const std::string text = explain::explain(g, o);
  MESSAGE(text);
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.2.indexer.ks"), ke = g.tensor<int32_t>("layers.2.indexer.ke");
  const Tensor<float> L = g.tensor<float>("layers.2.indexer.logits");
  const Tensor<int32_t> topk = g.tensor<int32_t>("layers.2.indexer.topk"), own = g.tensor<int32_t>("layers.3.indexer.topk");
  const int64_t k = topk.dim(1), t = 15;
  CHECK(has(text, "layer     3 (Shared: it reuses Full layer 2's positions)"));
  CHECK(has(text, "window [ks, ke) = [" + std::to_string(ks[t]) + ", " + std::to_string(ke[t]) + ")"));
  CHECK(has(text, "layer 2's (it chose the positions) logits"));
  // The k-th score is the k-th selected logit of the source layer (the golden top-k is in order).
  char kth[64];
  std::snprintf(kth, sizeof kth, "k-th score %.6g", double(L.at(t, ks[t] + topk.at(t, k - 1))));
  CHECK(has(text, kth));
  // The largest logit comes first, at rank 1, marked selected.
  const int32_t best = topk.at(t, 0);
  CHECK(has(text, "             1  " + std::string(8 - std::to_string(best).size(), ' ') + std::to_string(best)));
  // Recall of the layer's own top-k against the positions it reuses.
  std::set<int32_t> a(own.data.begin() + t * k, own.data.begin() + (t + 1) * k), b(topk.data.begin() + t * k, topk.data.begin() + (t + 1) * k);
  int common = 0;
  for (int32_t p : a) common += int(b.count(p));
  CHECK(has(text, "its own top-k would share " + std::to_string(common) + " of " + std::to_string(a.size())));
  // Attention: max_logits and lse of every head as in the set.
  const Tensor<float> lse = g.tensor<float>("layers.3.attn.lse"), ml = g.tensor<float>("layers.3.attn.max_logits");
  for (int64_t h = 0; h < 2; ++h) CHECK(has(text, g7(ml.at(t, h)) + "  " + g7(lse.at(t, h))));
  CHECK(has(text, "(no sink)"));
  CHECK(has(text, "head 0: the heaviest positions"));
}

TEST_CASE("explain: ties at the k-th score are marked, short rows say every key is selected, the sink factor is shown") {
  {
    const golden::Loaded g = golden::read(golden_dir("ties"));
    const Tensor<float> L = g.tensor<float>("layers.0.indexer.logits");
    const Tensor<int32_t> topk = g.tensor<int32_t>("layers.0.indexer.topk"), ks = g.tensor<int32_t>("layers.0.indexer.ks"),
                          ke = g.tensor<int32_t>("layers.0.indexer.ke");
    const int64_t k = topk.dim(1);
    int64_t row = -1, n_ties = 0, n_in = 0;  // a row whose k-th score ties with an unselected position
    for (int64_t t = 0; t < topk.dim(0) && row < 0; ++t) {
      const float kth = L.at(t, ks[t] + topk.at(t, k - 1));
      int64_t n = 0, in = 0;
      std::set<int32_t> sel(topk.data.begin() + t * k, topk.data.begin() + (t + 1) * k);
      for (int32_t s = 0; s < ke[t] - ks[t]; ++s)
        if (L.at(t, ks[t] + s) == kth) { ++n; in += int64_t(sel.count(s)); }
      if (n > in) { row = t; n_ties = n; n_in = in; }
    }
    REQUIRE(row >= 0);
    explain::Options o;
    o.row = row;
    const std::string text = explain::explain(g, o);
    CHECK(has(text, std::to_string(n_ties) + " positions tie with it, " + std::to_string(n_in) + " selected and " +
                        std::to_string(n_ties - n_in) + " not"));
    size_t marks = 0;
    for (size_t at = text.find("TIE at the boundary"); at != std::string::npos; at = text.find("TIE at the boundary", at + 1)) ++marks;
    CHECK(marks == size_t(n_ties));  // every tied position is listed and marked
  }
  {
    const golden::Loaded g = golden::read(golden_dir("short-rows"));
    explain::Options o;
    o.row = 3;
    CHECK(has(explain::explain(g, o), "is not longer than top-k (64): every visible key is selected"));
  }
  {
    const golden::Loaded g = golden::read(golden_dir("attention-edge"));
    const Tensor<float> sink = g.tensor<float>("layers.0.attn.sink"), lse = g.tensor<float>("layers.0.attn.lse");
    explain::Options o;
    o.row = 2;
    o.head = 1;
    char f[64];
    std::snprintf(f, sizeof f, "%.6g (sink %.6g)", 1.0 / (1.0 + std::exp(double(sink[1]) - double(lse.at(2, 1)))), double(sink[1]));
    const std::string text = explain::explain(g, o);
    CHECK(has(text, f));
    CHECK(has(text, "head 1: the heaviest positions"));
  }
}

TEST_CASE("explain --candidate: where the candidate departs on the row, relative to the bound") {
  const golden::Loaded g = golden::read(golden_dir("glm-5.2"));
  Tensor<float> out = g.tensor<float>("layers.6.attn.out");
  const Tensor<float> lse = g.tensor<float>("layers.6.attn.lse");
  Tensor<int32_t> topk = g.tensor<int32_t>("layers.6.indexer.topk");
  std::vector<io::TensorView> views = {io::make_view("layers.6.attn.out", out), io::make_view("layers.6.attn.lse", lse),
                                       io::make_view("layers.6.indexer.topk", topk)};
  explain::Options o;
  o.layer = 6;
  o.row = 9;
  {
    TmpCandidate c(views);
    const io::SafetensorsFile f = io::read_safetensors(c.path);
    const std::string text = explain::explain(g, o, &f);
    CHECK(has(text, "indexer.topk (positions): the golden's set"));
    CHECK(has(text, "verdict on this row: within every bound"));
  }
  out.at(9, 1, 77) += 0.05f;  // one element of head 1, far beyond its bound
  topk.at(9, 0) = -1;         // and a dropped winner
  std::swap(topk.at(9, 0), topk.at(9, topk.dim(1) - 1));
  views = {io::make_view("layers.6.attn.out", out), io::make_view("layers.6.indexer.topk", topk)};
  TmpCandidate c(views);
  const io::SafetensorsFile f = io::read_safetensors(c.path);
  const std::string text = explain::explain(g, o, &f);
  MESSAGE(text);
  CHECK(has(text, "head 1: "));
  CHECK(has(text, "(column 77, "));
  CHECK(has(text, "1 column(s) over their bound"));
  CHECK(has(text, "missing " + std::to_string(g.tensor<int32_t>("layers.6.indexer.topk").at(9, 0)) + ", extra (none)"));
  CHECK(has(text, "verdict on this row: departs, most at"));
  // Another row of the same candidate is untouched.
  o.row = 8;
  CHECK(has(explain::explain(g, o, &f), "within every bound"));
}

TEST_CASE("explain: the CLI prints the report and its replay line, a layer, row or head outside the set is exit 2") {
  const std::string set = golden_dir("glm-5.2");
  auto r = indexshare::testing::run_cli("explain --golden " + set + " --layer 7 --row 4 --head 1");
  CHECK(r.status == 0);
  CHECK(has(r.out, "layer     7 (Shared: it reuses Full layer 6's positions)"));
  CHECK(has(r.out, "__REPRO: indexshare explain --golden " + set + " --layer 7 --row 4 --head 1"));
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"--layer 8 --row 0", "--layer 8 is outside the golden set's 8 layers (0..7)"},
           {"--layer 0 --row 16", "--row 16 is outside the set's 16 query rows (0..15)"},
           {"--layer 0 --row 0 --head 2", "--head 2 is outside the set's 2 heads (0..1)"},
           {"--layer 0 --row -1", "--row -1 is outside"}}) {
    r = indexshare::testing::run_cli("explain --golden " + set + " " + args);
    CHECK(r.status == 2);
    CHECK_MESSAGE(has(r.out, msg), r.out);
  }
}
