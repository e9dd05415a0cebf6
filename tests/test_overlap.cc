// Tests of ref/overlap (cross-layer overlap statistics, greedy pattern search) and of the
// renderers in tools/svg. Expected numbers are worked out by hand in the comments.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ref/overlap.h"
#include "ref/topk.h"
#include "tools/lib/golden.h"
#include "tools/lib/svg.h"
#include "tests/xml_check.h"

using namespace indexshare;

namespace {

Tensor<int32_t> topk_tensor(int64_t s_q, int64_t k, const std::vector<int32_t>& v) {
  Tensor<int32_t> t({s_q, k});
  REQUIRE(int64_t(v.size()) == s_q * k);
  t.data = v;
  return t;
}

bf16_t bf(float x) { return f32_to_bf16(x); }

// Copies every indexer tensor of `from` into `to` (the attention inputs stay `to`'s own).
void copy_indexer(const ref::LayerInputs& from, ref::LayerInputs& to) {
  to.index_q8 = from.index_q8;
  to.index_k8 = from.index_k8;
  to.index_q = from.index_q;
  to.index_k = from.index_k;
  to.index_q_scale = from.index_q_scale;
  to.index_k_scale = from.index_k_scale;
  to.index_weights = from.index_weights;
}

// 8 layers whose indexers come in blocks [0-2], [3-4], [5-7]: identical within a block,
// unrelated across blocks (sim = 0); every layer keeps its own attention inputs.
struct Planted {
  Problem p = parse_problem("sq24 skv64 hq2 dqk16 dv8 ih4 id32 k8 seed11 nl8 sim=0");
  std::vector<ref::LayerInputs> in;
  Planted() {
    in = ref::make_stack_inputs(p, schedule_preset("all-full", 8));
    for (int l : {1, 2}) copy_indexer(in[0], in[size_t(l)]);
    copy_indexer(in[3], in[4]);
    for (int l : {6, 7}) copy_indexer(in[5], in[size_t(l)]);
  }
};

std::filesystem::path temp_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("indexshare_test_overlap_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

bool have_python3() { return std::system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") == 0; }

}  // namespace

TEST_CASE("overlap: percentiles follow the nearest-rank rule on a hand list") {
  // Sorted 15 20 35 40 50 (n = 5): rank r = max(1, ceil(p * 5 / 100)).
  const std::vector<double> x = {15, 20, 35, 40, 50};
  CHECK(ref::percentile_nearest_rank(x, 0) == 15);    // r = max(1, 0) = 1
  CHECK(ref::percentile_nearest_rank(x, 10) == 15);   // ceil(0.5) = 1
  CHECK(ref::percentile_nearest_rank(x, 30) == 20);   // ceil(1.5) = 2
  CHECK(ref::percentile_nearest_rank(x, 40) == 20);   // ceil(2.0) = 2
  CHECK(ref::percentile_nearest_rank(x, 50) == 35);   // ceil(2.5) = 3
  CHECK(ref::percentile_nearest_rank(x, 90) == 50);   // ceil(4.5) = 5
  CHECK(ref::percentile_nearest_rank(x, 100) == 50);  // ceil(5.0) = 5
  CHECK_THROWS_AS(ref::percentile_nearest_rank(x, 101), Error);
  CHECK_THROWS_AS(ref::percentile_nearest_rank({}, 50), Error);

  // Unsorted input; mean (50 + 15 + 40 + 20 + 35) / 5 = 32.
  const ref::DistSummary d = ref::summarize_distribution({50, 15, 40, 20, 35});
  CHECK(d.count == 5);
  CHECK(d.mean == 32);
  CHECK(d.min == 15);
  CHECK(d.p10 == 15);
  CHECK(d.p50 == 35);
  CHECK(d.p90 == 50);
  CHECK(d.max == 50);

  // 1..10: p10 -> r = 1 -> 1, p50 -> r = 5 -> 5, p90 -> r = 9 -> 9; mean 5.5.
  const ref::DistSummary e = ref::summarize_distribution({10, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  CHECK(e.p10 == 1);
  CHECK(e.p50 == 5);
  CHECK(e.p90 == 9);
  CHECK(e.mean == 5.5);

  const ref::DistSummary empty = ref::summarize_distribution({});
  CHECK(empty.count == 0);
  CHECK(std::isnan(empty.mean));
  CHECK(std::isnan(empty.p50));
}

TEST_CASE("overlap: overlap and Jaccard on hand-written top-k, trivial rows counted apart") {
  // k = 4, five rows with valid lengths 10, 10, 3, 4, 12.
  const std::vector<int64_t> len = {10, 10, 3, 4, 12};
  const Tensor<int32_t> a = topk_tensor(5, 4, {0, 1, 2, 3,     //
                                               5, 6, 7, 8,     //
                                               2, 0, 1, -1,    // trivial (3 <= 4), -1 padded
                                               0, 1, 2, 3,     // trivial (4 <= 4)
                                               9, 1, 4, 6});
  const Tensor<int32_t> b = topk_tensor(5, 4, {3, 2, 1, 0,     // same set, other order: 1, 1
                                               7, 8, 9, 0,     // {7, 8}: 2/4 = 0.5, 2/6 = 1/3
                                               -1, 1, 2, 0,    // padding elsewhere: still trivial
                                               3, 2, 1, 0,     //
                                               1, 2, 3, 5});   // {1}: 1/4, union 7: 1/7
  const std::vector<ref::RowOverlap> rows = ref::row_overlaps(a, b, len);
  REQUIRE(rows.size() == 5);
  CHECK(!rows[0].trivial);
  CHECK(rows[0].overlap == 1.0);
  CHECK(rows[0].jaccard == 1.0);
  CHECK(rows[1].common == 2);
  CHECK(rows[1].union_size == 6);
  CHECK(rows[1].overlap == 0.5);
  CHECK(rows[1].jaccard == doctest::Approx(1.0 / 3.0));
  CHECK(rows[2].trivial);
  CHECK(rows[2].size_a == 3);
  CHECK(std::isnan(rows[2].overlap));
  CHECK(rows[3].trivial);
  CHECK(rows[4].common == 1);
  CHECK(rows[4].overlap == 0.25);
  CHECK(rows[4].jaccard == doctest::Approx(1.0 / 7.0));

  // Two buckets over 5 rows: rows [0, 3) and [3, 5).
  const std::vector<ref::QueryBucket> buckets = ref::query_buckets(5, 2, 100);
  const ref::PairOverlap p = ref::pair_overlap(a, b, len, buckets, 2, 3);
  CHECK(p.a == 2);
  CHECK(p.b == 3);
  CHECK(p.rows == 5);
  CHECK(p.trivial_rows == 2);
  // Headline over {1, 0.5, 0.25}: mean 1.75 / 3; nearest rank with n = 3: p10 r1, p50 r2, p90 r3.
  CHECK(p.overlap.count == 3);
  CHECK(p.overlap.mean == doctest::Approx(1.75 / 3.0));
  CHECK(p.overlap.min == 0.25);
  CHECK(p.overlap.p10 == 0.25);
  CHECK(p.overlap.p50 == 0.5);
  CHECK(p.overlap.p90 == 1.0);
  CHECK(p.overlap.max == 1.0);
  // Jaccard {1, 1/3, 1/7}: mean (21 + 7 + 3) / 21 / 3 = 31 / 63.
  CHECK(p.jaccard.mean == doctest::Approx(31.0 / 63.0));
  // Buckets: rows 0, 1 (row 2 trivial) -> mean 0.75; rows 3 (trivial), 4 -> 0.25.
  REQUIRE(p.overlap_by_bucket.size() == 2);
  CHECK(p.overlap_by_bucket[0].count == 2);
  CHECK(p.overlap_by_bucket[0].mean == 0.75);
  CHECK(p.overlap_by_bucket[1].count == 1);
  CHECK(p.overlap_by_bucket[1].mean == 0.25);
  CHECK(buckets[1].pos_begin == 103);
  CHECK(buckets[1].pos_end == 105);

  // Tensors that are not a top-k are refused, naming the row.
  Tensor<int32_t> bad = a;
  bad.at(1, 3) = 5;  // repeats 5
  CHECK_THROWS_WITH_AS(ref::row_overlaps(bad, b, len), doctest::Contains("row 1 repeats"), Error);
  bad = a;
  bad.at(4, 0) = 12;  // outside [0, 12)
  CHECK_THROWS_WITH_AS(ref::row_overlaps(bad, b, len), doctest::Contains("row 4 slot 0"), Error);
  bad = a;
  bad.at(0, 2) = -1;  // a non-trivial row must select k positions
  CHECK_THROWS_WITH_AS(ref::row_overlaps(bad, b, len), doctest::Contains("row 0 selects 3"), Error);
  bad = a;
  bad.at(2, 3) = 2;  // ... and a trivial row all L of them, once each
  CHECK_THROWS_AS(ref::row_overlaps(bad, b, len), Error);
}

TEST_CASE("overlap: query buckets split the rows by floor(t * n / s_q)") {
  // s_q = 10, 4 buckets: t = 0..2 -> 0, 3..4 -> 1, 5..7 -> 2, 8..9 -> 3.
  const auto b = ref::query_buckets(10, 4);
  const int64_t begin[4] = {0, 3, 5, 8}, end[4] = {3, 5, 8, 10};
  for (int i = 0; i < 4; ++i) {
    CHECK(b[size_t(i)].t_begin == begin[i]);
    CHECK(b[size_t(i)].t_end == end[i]);
  }
  // s_q = 2, 4 buckets: t = 0 -> 0, t = 1 -> 2; buckets 1 and 3 are empty.
  const auto c = ref::query_buckets(2, 4);
  CHECK(c[0].t_end - c[0].t_begin == 1);
  CHECK(c[1].t_end - c[1].t_begin == 0);
  CHECK(c[2].t_begin == 1);
  CHECK(c[2].t_end == 2);
  CHECK(c[3].t_end - c[3].t_begin == 0);
  CHECK_THROWS_AS(ref::query_buckets(10, 0), Error);
}

TEST_CASE("overlap: dense attention mass and the mass / KL divergences on a hand example") {
  // One row, one head, d_qk = 1, sm = 1: q = 1, keys 0, 1, 2 -> logits 0, 1, 2.
  Problem p = parse_problem("sq1 skv3 hq1 dqk1 dv1 ih1 id1 k2");
  p.sm = 1.0f;
  ref::LayerInputs in;
  in.q = Tensor<bf16_t>({1, 1, 1}, bf(1.0f));
  in.kv = Tensor<bf16_t>({3, 1, 1});
  for (int s = 0; s < 3; ++s) in.kv[s] = bf(float(s));
  in.ks = Tensor<int32_t>({1}, 0);
  in.ke = Tensor<int32_t>({1}, 3);

  const double e1 = std::exp(1.0), e2 = std::exp(2.0), z = 1.0 + e1 + e2;
  const Tensor<double> prob = ref::dense_probabilities(in.q, in.kv, 1.0f, in.ks, in.ke);
  CHECK(prob.at(0, 0, 0) == doctest::Approx(1.0 / z).epsilon(1e-14));
  CHECK(prob.at(0, 0, 1) == doctest::Approx(e1 / z).epsilon(1e-14));
  CHECK(prob.at(0, 0, 2) == doctest::Approx(e2 / z).epsilon(1e-14));
  // Used positions = all keys: the captured mass is 1, and nothing of any own set is lost.
  CHECK(prob.at(0, 0, 0) + prob.at(0, 0, 1) + prob.at(0, 0, 2) == doctest::Approx(1.0).epsilon(1e-15));
  CHECK(ref::row_divergence(p, in, 0, {1, 2}, {0, 1, 2}).mass_lost == 0.0);
  CHECK(ref::row_divergence(p, in, 0, {1, 2}, {0, 1, 2}).mass_kept == 1.0);
  // Identical sets: both divergences exactly 0.
  const ref::RowDivergence same = ref::row_divergence(p, in, 0, {0, 2}, {0, 2});
  CHECK(same.mass_lost == 0.0);
  CHECK(same.kl == 0.0);

  // O = {1, 2}, U = {0, 2}: pO = (1, e) / (1 + e), qU = (1, e^2) / (1 + e^2).
  // mass lost = pO(1) = 1 / (1 + e);
  // KL = pO(1) ln(pO(1) / (eps pO(1))) + pO(2) ln(pO(2) / ((1 - eps) qU(2) + eps pO(2))).
  const double eps = ref::kKlSkew;
  const double pO1 = 1.0 / (1.0 + e1), pO2 = e1 / (1.0 + e1), qU2 = e2 / (1.0 + e2);
  const double kl = pO1 * std::log(1.0 / eps) + pO2 * std::log(pO2 / ((1.0 - eps) * qU2 + eps * pO2));
  const ref::RowDivergence d = ref::row_divergence(p, in, 0, {1, 2}, {0, 2});
  CHECK(d.mass_lost == doctest::Approx(pO1).epsilon(1e-14));
  CHECK(d.kl == doctest::Approx(kl).epsilon(1e-12));
  // mass_recall = sum_{U∩O} P / sum_O P = e^2 / (e + e^2).
  CHECK(d.mass_kept == doctest::Approx(e2 / (e1 + e2)).epsilon(1e-14));
  // Disjoint sets keep nothing: exactly 0.
  CHECK(ref::row_divergence(p, in, 0, {1}, {0}).mass_kept == 0.0);
  CHECK(ref::row_divergence(p, in, 0, {1}, {0}).mass_lost == 1.0);
}

TEST_CASE("overlap: dense probabilities agree with dense_attention's lse") {
  const Problem p = parse_problem("sq6 skv20 hq3 dqk16 dv8 ih2 id16 k4 seed9");
  const ref::LayerInputs in = ref::make_layer_inputs(p);
  const Tensor<double> prob = ref::dense_probabilities(in.q, in.kv, p.sm_scale(), in.ks, in.ke);
  const ref::AttentionOut dense = ref::dense_attention(in.q, in.kv, p.sm_scale(), p.d_v, in.ks, in.ke);
  for (int64_t t = 0; t < p.s_q; ++t)
    for (int64_t h = 0; h < p.h_q; ++h) {
      CAPTURE(t);
      CAPTURE(h);
      double sum = 0.0;
      for (int64_t s = 0; s < p.s_kv; ++s) {
        if (s >= in.ke[t]) {
          CHECK(prob.at(t, h, s) == 0.0);
          continue;
        }
        sum += prob.at(t, h, s);
        // P = exp(logit - lse); lse is stored in f32.
        const double logit = ref::attention_logit(in.q, in.kv, t, h, s, p.sm_scale());
        CHECK(prob.at(t, h, s) == doctest::Approx(std::exp(logit - double(dense.lse.at(t, h)))).epsilon(1e-5));
      }
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-14));
    }
}

TEST_CASE("overlap: relative error in parts (the MPI search's blocks) has the whole tensor's bits") {
  // Magnitudes far apart, so that any other summation order would round differently.
  Tensor<float> ref_t({7}), got({7});
  ref_t.data = {1e8f, 3.0f, -7.5e-3f, 1e-8f, 2.5e7f, -4.0f, 0.3f};
  got.data = {1e8f + 8.0f, 2.9f, -7.4e-3f, 3e-8f, 2.5e7f, -4.25f, 0.1f};
  const double whole = ref::relative_error(got, ref_t);
  for (int64_t cut = 0; cut <= 7; ++cut) {
    ref::RelativeError e;
    e.add(got.data.data(), ref_t.data.data(), cut);
    e.add(got.data.data() + cut, ref_t.data.data() + cut, 7 - cut);
    CHECK(e.value() == whole);
  }
  CHECK(ref::RelativeError{}.value() == 0.0);  // nothing added: both norms 0
}

TEST_CASE("overlap: relative error by hand, and 0 when shared positions equal own") {
  Tensor<float> ref_t({2}), got({2});
  ref_t.data = {3.0f, 4.0f};
  got.data = {3.0f, 5.0f};
  CHECK(ref::relative_error(got, ref_t) == doctest::Approx(0.2));  // ||(0, 1)|| / ||(3, 4)|| = 1 / 5
  CHECK(ref::relative_error(ref_t, ref_t) == 0.0);
  const Tensor<float> zero({2}, 0.0f);
  CHECK(ref::relative_error(zero, zero) == 0.0);
  CHECK(std::isinf(ref::relative_error(got, zero)));

  // sim = 1: every layer has the same indexer, so a Shared layer's used positions equal its own:
  // recall 1, mass recall 1, mass used = mass own, output error exactly 0.
  const Problem p = parse_problem("sq12 skv40 hq2 dqk16 dv8 ih4 id32 k6 seed3 nl4 sched=FSSF sim=1");
  const ref::OverlapReport r = ref::overlap_report(p);
  REQUIRE(r.shared.size() == 2);
  for (const auto& s : r.shared) {
    CAPTURE(s.layer);
    CHECK(s.source == 0);
    CHECK(s.recall.min == 1.0);
    CHECK(s.mass_recall.min == 1.0);
    CHECK(s.mass_used.mean == s.mass_own.mean);
    CHECK(s.out_rel_error == 0.0);
  }
  CHECK(r.adjacent_overlap.min == 1.0);
}

TEST_CASE("overlap: the report of a generated stack matches a direct computation") {
  const Problem p = parse_problem("sq16 skv48 hq2 dqk16 dv8 ih4 id32 k8 seed5 nl5 sched=FSFSS sim=0.5");
  const Schedule s = p.schedule();
  const auto in = ref::make_stack_inputs(p, s);
  const auto out = ref::run_stack(p, s, in);
  const ref::OverlapReport r = ref::overlap_report(p, in, out, {4, true, {}});
  CHECK(r.pattern == "FSFSS");
  CHECK(r.n_layers == 5);
  // Row t sees 48 - 16 + t + 1 = 33 + t keys > 8: no trivial row.
  CHECK(r.trivial_rows == 0);
  REQUIRE(r.adjacent.size() == 4);
  // Mean over rows of |A ∩ B| / k for own top-k of layers 1 and 2, with std::set.
  double sum = 0;
  for (int64_t t = 0; t < p.s_q; ++t) {
    std::set<int32_t> sa, sb;
    for (int64_t j = 0; j < p.index_topk; ++j) sa.insert(out[1].own_topk.at(t, j)), sb.insert(out[2].own_topk.at(t, j));
    int64_t common = 0;
    for (int32_t v : sa) common += int64_t(sb.count(v));
    sum += double(common) / double(p.index_topk);
  }
  CHECK(r.adjacent[1].overlap.mean == doctest::Approx(sum / double(p.s_q)));
  CHECK(r.overlap_at(1, 2) == r.adjacent[1].overlap.mean);
  for (int i = 0; i < 5; ++i) {
    CHECK(r.overlap_at(i, i) == 1.0);
    for (int j = 0; j < 5; ++j) CHECK(r.overlap_at(i, j) == r.overlap_at(j, i));
  }
  // Pooled: 4 pairs x 16 rows; per bucket 4 pairs x 4 rows.
  CHECK(r.adjacent_overlap.count == 64);
  REQUIRE(r.adjacent_by_bucket.size() == 4);
  for (const auto& b : r.adjacent_by_bucket) CHECK(b.count == 16);
  // Shared layers 1, 3, 4 with sources 0, 2, 2.
  REQUIRE(r.shared.size() == 3);
  const int layers[3] = {1, 3, 4}, sources[3] = {0, 2, 2};
  for (int i = 0; i < 3; ++i) {
    const auto& st = r.shared[size_t(i)];
    const int l = layers[i];
    CAPTURE(l);
    CHECK(st.layer == l);
    CHECK(st.source == sources[i]);
    // Recall is the overlap of own and source top-k.
    CHECK(st.recall.mean == doctest::Approx(r.overlap_at(l, sources[i])));
    // Output error against the layer's attention over its own positions, recomputed here.
    const auto own = ref::layer_attention(p, in[size_t(l)], ref::local_to_kv_rows(out[size_t(l)].own_topk, in[size_t(l)].ks));
    CHECK(st.out_rel_error == ref::relative_error(out[size_t(l)].attn.out, own.out));
    CHECK(st.out_rel_error > 0.0);
    CHECK(st.mass_used.max <= 1.0 + 1e-12);
    CHECK(st.mass_own.min > 0.0);
    CHECK(st.mass_recall.max <= 1.0 + 1e-12);
    CHECK(st.mass_recall.min >= 0.0);
  }

  // own=no: Shared layers have no own top-k, so their matrix entries are NaN and no costs.
  Problem q = p;
  q.own = false;
  const ref::OverlapReport rn = ref::overlap_report(q);
  CHECK(rn.shared.empty());
  CHECK(rn.adjacent.empty());  // no two adjacent layers both have own top-k in FSFSS
  CHECK(std::isnan(rn.overlap_at(0, 1)));
  CHECK(rn.overlap_at(0, 2) == r.overlap_at(0, 2));
}

TEST_CASE("overlap: the output search loss of a schedule equals the run_stack definition") {
  const Problem p = parse_problem("sq10 skv40 hq2 dqk16 dv8 ih4 id32 k6 seed2 nl5 sim=0.4");
  const Schedule all_full = schedule_preset("all-full", 5), s = schedule_from_pattern("FSSFS");
  const auto in = ref::make_stack_inputs(p, all_full);
  const auto a = ref::run_stack(p, all_full, in, false), b = ref::run_stack(p, s, in, false);
  double sum = 0.0;
  for (int l = 0; l < 5; ++l) sum += ref::relative_error(b[size_t(l)].attn.out, a[size_t(l)].attn.out);
  CHECK(ref::schedule_loss(p, in, s, ref::SearchLoss::output) == doctest::Approx(sum / 5.0).epsilon(1e-15));
  CHECK(ref::schedule_loss(p, in, all_full, ref::SearchLoss::output) == 0.0);
  CHECK(ref::schedule_loss(p, in, all_full, ref::SearchLoss::mass) == 0.0);
  CHECK(ref::schedule_loss(p, in, all_full, ref::SearchLoss::kl) == 0.0);
  CHECK(ref::schedule_loss(p, in, s, ref::SearchLoss::mass) > 0.0);
  CHECK(ref::schedule_loss(p, in, s, ref::SearchLoss::kl) > 0.0);

  CHECK(ref::parse_search_loss("kl") == ref::SearchLoss::kl);
  CHECK_THROWS_WITH_AS(ref::parse_search_loss("lm"), doctest::Contains("'lm'"), Error);
}

TEST_CASE("overlap: greedy search recovers planted indexer blocks, for each loss") {
  const Planted planted;
  for (ref::SearchLoss loss : {ref::SearchLoss::output, ref::SearchLoss::mass, ref::SearchLoss::kl}) {
    CAPTURE(ref::search_loss_name(loss));
    const ref::SearchResult r = ref::greedy_search(planted.p, planted.in, {3, loss, {}});
    // Flipping a layer inside a block costs exactly 0 (its source has the same top-k); flipping a
    // block's first layer costs > 0. So the five zero-cost flips go first, lowest index first.
    CHECK(r.pattern == "FSSFSFSS");
    CHECK(r.flips == std::vector<int>{1, 2, 4, 6, 7});
    CHECK(r.losses == std::vector<double>{0, 0, 0, 0, 0});
    CHECK(r.initial_loss == 0.0);
    REQUIRE(r.steps.size() == 5);
    CHECK(r.steps[0].candidates == std::vector<int>{1, 2, 3, 4, 5, 6, 7});
    for (size_t i = 0; i < r.steps[0].candidates.size(); ++i) {
      const int l = r.steps[0].candidates[i];
      CAPTURE(l);
      if (l == 3 || l == 5) CHECK(r.steps[0].candidate_losses[i] > 0.0);
      else CHECK(r.steps[0].candidate_losses[i] == 0.0);
    }
    CHECK(r.steps[4].pattern == "FSSFSFSS");

    // One block fewer: the sixth flip must remove a block head, at a positive loss.
    const ref::SearchResult r2 = ref::greedy_search(planted.p, planted.in, {2, loss, {}});
    REQUIRE(r2.flips.size() == 6);
    CHECK((r2.pattern == "FSSSSFSS" || r2.pattern == "FSSFSSSS"));
    CHECK(r2.losses.back() > 0.0);
    CHECK(r2.losses.back() == doctest::Approx(ref::schedule_loss(planted.p, planted.in, schedule_from_pattern(r2.pattern), loss)));
  }
}

TEST_CASE("overlap: greedy search bookkeeping and errors") {
  const Problem p = parse_problem("sq8 skv32 hq2 dqk16 dv8 ih4 id32 k4 seed4 nl6 sim=0.6 sched=FSSSSS own=no");
  const ref::SearchResult r = ref::greedy_search(p, {2, ref::SearchLoss::output, {}});  // own/sched ignored
  CHECK(r.n_layers == 6);
  REQUIRE(r.flips.size() == 4);
  CHECK(std::count(r.pattern.begin(), r.pattern.end(), 'F') == 2);
  CHECK(r.pattern[0] == 'F');
  std::set<int> flipped(r.flips.begin(), r.flips.end());
  CHECK(flipped.size() == 4);
  CHECK(flipped.count(0) == 0);
  // Each step's loss is its candidate minimum, and its pattern has one more S.
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const auto& st = r.steps[i];
    CHECK(st.loss == *std::min_element(st.candidate_losses.begin(), st.candidate_losses.end()));
    CHECK(std::count(st.pattern.begin(), st.pattern.end(), 'S') == int(i) + 1);
    CHECK(st.pattern[size_t(st.flipped)] == 'S');
  }
  REQUIRE(r.layer_costs.size() == 6);
  double sum = 0;
  for (double c : r.layer_costs) sum += c;
  CHECK(sum / 6.0 == doctest::Approx(r.losses.back()));
  // n_full = nl: nothing to flip.
  CHECK(ref::greedy_search(p, {6, ref::SearchLoss::kl, {}}).pattern == "FFFFFF");

  CHECK_THROWS_WITH_AS(ref::greedy_search(p, {0, ref::SearchLoss::output, {}}), doctest::Contains("n_full"), Error);
  CHECK_THROWS_WITH_AS(ref::greedy_search(p, {7, ref::SearchLoss::output, {}}), doctest::Contains("n_full"), Error);
  const auto no_indexer = ref::make_stack_inputs(p, p.schedule());  // own=no: Shared layers lack one
  CHECK_THROWS_WITH_AS(ref::greedy_search(p, no_indexer, {2, ref::SearchLoss::output, {}}),
                       doctest::Contains("use own=yes"), Error);
}

TEST_CASE("overlap: JSON, CSV and table renderers") {
  const Problem p = parse_problem("sq12 skv20 hq2 dqk16 dv8 ih4 id32 k8 seed6 nl4 sched=FSFS sim=0.5");
  const ref::OverlapReport r = ref::overlap_report(p);
  // Row t sees 20 - 12 + t + 1 = 9 + t > 8 keys: no trivial row.
  CHECK(r.trivial_rows == 0);
  const nlohmann::json j = io::overlap_to_json(r);
  const nlohmann::json back = nlohmann::json::parse(j.dump());
  CHECK(back["schedule"] == "FSFS");
  CHECK(back["adjacent"]["overlap"]["mean"].get<double>() == doctest::Approx(r.adjacent_overlap.mean));
  CHECK(back["matrix"]["overlap"][1][2].get<double>() == doctest::Approx(r.overlap_at(1, 2)));
  CHECK(back["shared"].size() == 2);

  // NaN becomes null in JSON and "nan" in CSV.
  ref::OverlapReport rn = r;
  rn.matrix_overlap[1] = std::nan("");
  CHECK(io::overlap_to_json(rn)["matrix"]["overlap"][0][1].is_null());
  const std::string csv = io::overlap_csv(rn);
  CHECK(csv.rfind("section,a,b,bucket,pos_begin,pos_end,metric,count,mean,min,p10,p50,p90,max\n", 0) == 0);
  CHECK(csv.find("matrix,0,1,,,,overlap,,nan,,,,,\n") != std::string::npos);
  CHECK(io::overlap_table(r).find("trivial") != std::string::npos);

  const ref::SearchResult s = ref::greedy_search(p, {2, ref::SearchLoss::mass, {}});
  const nlohmann::json js = io::search_to_json(s);
  CHECK(js["pattern"] == s.pattern);
  CHECK(js["losses"].size() == 2);
  CHECK(js["loss"] == "mass");
  const std::string scsv = io::search_csv(s);
  CHECK(std::count(scsv.begin(), scsv.end(), '\n') == 4);  // header, step 0, two steps
  CHECK(io::search_table(s).find(s.pattern) != std::string::npos);
}

TEST_CASE("overlap: SVG figures are well-formed XML with escaped text") {
  CHECK(io::xml_escape("a<b & \"c\" 'd'>") == "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  CHECK(indexshare::testing::xml_problem("<a><b x=\"1\"/></a>").empty());
  CHECK(!indexshare::testing::xml_problem("<a><b></a>").empty());
  CHECK(!indexshare::testing::xml_problem("<a>x & y</a>").empty());
  CHECK(!indexshare::testing::xml_problem("<a x=\"1\" y=\"a=b\" x=\"2\"/>").empty());
  CHECK(indexshare::testing::xml_problem("<a x=\"1\" y=\"x=b\"/>").empty());

  const Problem p = parse_problem("sq24 skv40 hq2 dqk16 dv8 ih4 id32 k8 seed8 nl6 sched=FSSFSS sim=0.7 recency=0.3");
  const ref::OverlapReport r = ref::overlap_report(p, {8, true, {}});
  const ref::SearchResult s = ref::greedy_search(p, {2, ref::SearchLoss::output, {}});
  io::HeatmapOptions jac;
  jac.jaccard = true;
  jac.title = "Jaccard <between> layers & \"friends\"";
  const std::vector<std::pair<std::string, std::string>> figures = {
      {"heatmap.svg", io::overlap_heatmap_svg(r)},
      {"heatmap_jaccard.svg", io::overlap_heatmap_svg(r, jac)},
      {"by_position.svg", io::overlap_by_position_svg(r)},
      {"search.svg", io::search_loss_svg(s, "loss <curve> & co")},
  };
  const bool python = have_python3();
  for (const auto& [name, svg] : figures) {
    CAPTURE(name);
    CHECK(svg.find("xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
    CHECK(svg.find("viewBox=\"0 0 ") != std::string::npos);
    CHECK(indexshare::testing::xml_problem(svg) == "");
    const auto path = temp_file(name);
    io::write_text_file(path.string(), svg);
    if (python) {
      const std::string cmd = "python3 -c 'import xml.dom.minidom,sys; d = xml.dom.minidom.parse(sys.argv[1]); "
                              "assert d.documentElement.tagName == \"svg\"' '" + path.string() + "'";
      CHECK(std::system(cmd.c_str()) == 0);
    }
    std::filesystem::remove(path);
  }
  CHECK(figures[1].second.find("Jaccard &lt;between&gt; layers &amp; &quot;friends&quot;") != std::string::npos);
  CHECK(figures[3].second.find("loss &lt;curve&gt; &amp; co") != std::string::npos);
  std::filesystem::remove(temp_file("x").parent_path());
}

// The synthetic stacks should look like real ones: with sim= alone every pair of layers overlaps
// alike; with drift= adjacent layers overlap most and the overlap decays with layer distance; the
// glm-5.2-drift preset has one jump, just before its Full layer 6.
TEST_CASE("overlap: drift= makes adjacent layers overlap most, decaying with distance, the glm-5.2-drift preset's jump") {
  auto adjacent_and_far = [](const std::string& desc) {
    const ref::OverlapReport r = ref::overlap_report(parse_problem(desc), {8, false, {}});
    double adj = 0, far = 0;
    for (int a = 0; a + 1 < r.n_layers; ++a) adj += r.overlap_at(a, a + 1) / (r.n_layers - 1);
    for (int a = 0; a + 6 < r.n_layers; ++a) far += r.overlap_at(a, a + 6) / (r.n_layers - 6);
    return std::pair{adj, far};
  };
  const std::string shapes = "sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed2 nl8 recency=0.25 sinks=2 ";
  const auto [adj_sim, far_sim] = adjacent_and_far(shapes + "sim=0.85");
  const auto [adj_drift, far_drift] = adjacent_and_far(shapes + "sim=0 drift=0.98");
  MESSAGE("sim=0.85: adjacent " << adj_sim << ", distance 6 " << far_sim << "; drift=0.98: " << adj_drift << ", " << far_drift);
  CHECK(std::fabs(adj_sim - far_sim) < 0.05);
  CHECK(adj_drift > 0.8);
  CHECK(adj_drift - far_drift > 0.08);
  const ref::OverlapReport g = ref::overlap_report(parse_problem(golden::preset("glm-5.2-drift").problem), {8, false, {}});
  for (int a = 0; a + 1 < 8; ++a) {
    CAPTURE(a);
    if (a == 5) CHECK(g.overlap_at(5, 6) < 0.7);
    else CHECK(g.overlap_at(a, a + 1) > 0.8);
  }
}
