// Overlap and the greedy search on DeepSeek-V4 block indices (ref/v4/sharing.h): the statistics
// against plain set counts and relative errors written here, the C4A-only Full/Shared rule (a
// pattern starts with F), and the refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "ref/error.h"
#include "ref/v4/sharing.h"

using namespace indexshare;
using namespace indexshare::ref::v4;

namespace {

// C4A layers at 1, 3, 4 (ranks 0, 1, 2) around SWA / HCA ones; rank 2 is a copy of rank 1's inputs
// (the same blocks and the same attention), so sharing rank 1's blocks costs it nothing.
struct Stack {
  Config cfg = tiny_config();
  std::vector<LayerType> types = parse_layer_types("SCHCC");
  std::vector<LayerInputs> in;
  BlockLayers b;
  Stack() {
    cfg.n_tokens = 64;
    for (size_t l = 0; l < types.size(); ++l) in.push_back(make_layer_inputs(cfg, int(l), types[l], types[l] == LayerType::csa));
    in[4] = in[3];
    b = block_layers(cfg, types, in);
  }
};

// Mean over the non-trivial rows of |A ∩ B| / k, counted with std::set.
double mean_overlap(const Config& cfg, const Tensor<int32_t>& a, const Tensor<int32_t>& b) {
  const int64_t k = a.dim(1), n_b = cfg.n_tokens / cfg.csa_ratio;
  double sum = 0;
  int rows = 0;
  for (int64_t t = 0; t < a.dim(0); ++t) {
    if (std::min((t + 1) / cfg.csa_ratio, n_b) <= k) continue;
    std::set<int32_t> x(&a[t * k], &a[t * k] + k), y(&b[t * k], &b[t * k] + k);
    int common = 0;
    for (int32_t v : x) common += y.count(v) ? 1 : 0;
    sum += double(common) / double(k);
    ++rows;
  }
  return sum / rows;
}

// ||out(U) - out(O)|| / ||out(O)|| of C4A rank j over rank i's blocks, in double.
double cost(const Stack& s, size_t j, size_t i) {
  const LayerInputs& li = s.in[size_t(s.b.layer[j])];
  LayerOutputs got, own;
  attend(s.cfg, LayerType::csa, li.q, li.kv, li.sink, s.b.entries[j], &s.b.own[i], got);
  attend(s.cfg, LayerType::csa, li.q, li.kv, li.sink, s.b.entries[j], &s.b.own[j], own);
  double d = 0, r = 0;
  for (int64_t e = 0; e < own.attn.out.numel(); ++e) {
    const double x = double(got.attn.out[e]) - double(own.attn.out[e]);
    d += x * x;
    r += double(own.attn.out[e]) * double(own.attn.out[e]);
  }
  return std::sqrt(d) / std::sqrt(r);
}

}  // namespace

TEST_CASE("v4 sharing: block overlap over the C4A layers") {
  const Stack s;
  REQUIRE(s.b.layer == std::vector<int>{1, 3, 4});
  const ref::OverlapReport r = block_overlap_report(s.cfg, s.b, "FFS", "spec", 4);
  CHECK(r.n_layers == 3);
  CHECK(r.pattern == "FFS");
  CHECK(r.topk == 4);
  CHECK(r.s_kv == 16);
  // rows t with floor((t + 1) / 4) <= 4 pick every causal block: t < 19
  CHECK(r.trivial_rows == 19);
  CHECK(r.overlap_at(1, 2) == 1.0);  // identical inputs
  CHECK(std::fabs(r.overlap_at(0, 1) - mean_overlap(s.cfg, s.b.own[0], s.b.own[1])) < 1e-12);
  CHECK(r.overlap_at(0, 1) < 1.0);
  REQUIRE(r.adjacent.size() == 2);
  CHECK(r.layers[2].kind == LayerKind::shared);
  CHECK(r.layers[2].source == 1);
  CHECK_THROWS_WITH_AS(block_overlap_report(s.cfg, s.b, "SFF", "spec"), doctest::Contains("starts with S"), Error);
  CHECK_THROWS_WITH_AS(block_overlap_report(s.cfg, s.b, "FF", "spec"), doctest::Contains("3 C4A layers"), Error);
}

TEST_CASE("v4 sharing: greedy search over the C4A ranks") {
  const Stack s;
  ref::SearchOptions opt;
  opt.n_full = 1;
  const ref::SearchResult r = block_search(s.cfg, s.in, s.b, "spec", opt);
  REQUIRE(r.steps.size() == 2);
  CHECK(r.n_layers == 3);
  // Step 1: rank 2 (a copy of rank 1) shares rank 1's blocks at no cost; rank 1 would cost c(1, 0).
  CHECK(r.flips[0] == 2);
  CHECK(r.losses[0] == 0.0);
  CHECK(std::fabs(r.steps[0].candidate_losses[0] - cost(s, 1, 0) / 3) < 1e-12);
  // Step 2: FSS, both from rank 0.
  CHECK(r.pattern == "FSS");
  CHECK(std::fabs(r.losses[1] - (cost(s, 1, 0) + cost(s, 2, 0)) / 3) < 1e-12);
  CHECK(r.losses[1] > 0);
  ref::SearchOptions mass = opt;
  mass.loss = ref::SearchLoss::mass;
  CHECK_THROWS_WITH_AS(block_search(s.cfg, s.in, s.b, "spec", mass), doctest::Contains("--loss output only"), Error);
  Stack shared;
  shared.in[3] = make_layer_inputs(shared.cfg, 3, LayerType::csa, false);
  shared.b = block_layers(shared.cfg, shared.types, shared.in);
  CHECK_THROWS_WITH_AS(block_search(shared.cfg, shared.in, shared.b, "spec", opt), doctest::Contains("C4A layer 3 has no indexer inputs"),
                       Error);
}
