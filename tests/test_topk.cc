// Tests of ref/topk: edge cases from the issue, and a brute-force full sort written here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ref/rng.h"
#include "ref/topk.h"

using namespace indexshare;

namespace {
const float kInf = std::numeric_limits<float>::infinity();

Tensor<float> row_logits(const std::vector<float>& v) {
  Tensor<float> t({1, int64_t(v.size())});
  t.data = v;
  return t;
}
Tensor<int32_t> vec(std::vector<int32_t> v) {
  Tensor<int32_t> t({int64_t(v.size())});
  t.data = std::move(v);
  return t;
}
std::vector<int32_t> row(const Tensor<int32_t>& t, int64_t r) {
  return std::vector<int32_t>(t.data.begin() + r * t.dim(1), t.data.begin() + (r + 1) * t.dim(1));
}
}  // namespace

TEST_CASE("topk: brute-force full sort agrees on random and tie-heavy rows") {
  for (Dist dist : {Dist::normal, Dist::ties, Dist::integer}) {
    const int64_t s_q = 40, s_kv = 57;
    Tensor<float> logits({s_q, s_kv});
    fill(logits.ptr(), logits.numel(), dist, 1.0f, 3, 9);
    Tensor<int32_t> ks({s_q}), ke({s_q});
    for (int64_t t = 0; t < s_q; ++t) {
      ks[t] = int32_t(t % 5);
      ke[t] = int32_t(std::min<int64_t>(s_kv, ks[t] + t + 1));
    }
    for (int64_t k : {1, 2, 7, 16, 60}) {
      CAPTURE(dist_name(dist));
      CAPTURE(k);
      Tensor<int32_t> got = ref::topk(logits, ks, ke, k);
      REQUIRE(got.shape == Shape{s_q, k});
      for (int64_t t = 0; t < s_q; ++t) {
        // Expected: sort all (score, index) pairs of the window by score desc, index asc.
        std::vector<std::pair<float, int32_t>> all;
        for (int32_t s = ks[t]; s < ke[t]; ++s) all.push_back({logits.at(t, s), s});
        std::stable_sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first > b.first; });
        std::vector<int32_t> expect(size_t(k), -1);
        for (size_t j = 0; j < std::min<size_t>(size_t(k), all.size()); ++j) expect[j] = all[j].second - ks[t];
        REQUIRE(row(got, t) == expect);
      }
    }
  }
}

TEST_CASE("topk: edge cases") {
  SUBCASE("topk >= length selects everything in score order, then -1") {
    Tensor<int32_t> got = ref::topk(row_logits({0.5f, 2.0f, -1.0f}), vec({0}), vec({3}), 5);
    CHECK(row(got, 0) == std::vector<int32_t>{1, 0, 2, -1, -1});
  }
  SUBCASE("topk = 1") {
    Tensor<int32_t> got = ref::topk(row_logits({0.5f, 2.0f, 2.0f}), vec({0}), vec({3}), 1);
    CHECK(row(got, 0) == std::vector<int32_t>{1});
  }
  SUBCASE("ties break by ascending index, and -0.0 equals +0.0") {
    Tensor<int32_t> got = ref::topk(row_logits({0.0f, 1.0f, -0.0f, 1.0f, 0.0f}), vec({0}), vec({5}), 4);
    CHECK(row(got, 0) == std::vector<int32_t>{1, 3, 0, 2});
  }
  SUBCASE("columns outside [ks, ke) never win, even with larger logits; output is local") {
    Tensor<int32_t> got = ref::topk(row_logits({9.0f, 1.0f, 2.0f, 9.0f}), vec({1}), vec({3}), 2);
    CHECK(row(got, 0) == std::vector<int32_t>{1, 0});  // columns 2, 1 minus ks = 1
  }
  SUBCASE("-inf logits inside the window are lowest but still positions") {
    Tensor<int32_t> got = ref::topk(row_logits({-kInf, 3.0f, -kInf}), vec({0}), vec({3}), 3);
    CHECK(row(got, 0) == std::vector<int32_t>{1, 0, 2});
  }
  SUBCASE("empty rows give all -1") {
    Tensor<float> l({2, 3}, 1.0f);
    Tensor<int32_t> got = ref::topk(l, vec({2, 0}), vec({2, 0}), 2);
    CHECK(row(got, 0) == std::vector<int32_t>{-1, -1});
    CHECK(row(got, 1) == std::vector<int32_t>{-1, -1});
  }
  SUBCASE("all rows short: a causal prefill with k larger than every row") {
    Tensor<float> l({4, 4});
    fill(l.ptr(), l.numel(), Dist::normal, 1.0f, 1, 1);
    Tensor<int32_t> ks({4}, 0), ke = vec({1, 2, 3, 4});
    Tensor<int32_t> got = ref::topk(l, ks, ke, 8);
    for (int64_t t = 0; t < 4; ++t) {
      std::vector<int32_t> r = row(got, t), sel(r.begin(), r.begin() + t + 1);
      std::sort(sel.begin(), sel.end());
      for (int32_t j = 0; j <= t; ++j) CHECK(sel[size_t(j)] == j);
      for (int64_t j = t + 1; j < 8; ++j) CHECK(r[size_t(j)] == -1);
    }
  }
}

TEST_CASE("topk: errors name the row and column") {
  Tensor<float> l({2, 4}, 1.0f);
  l.at(1, 2) = std::nanf("");
  CHECK_THROWS_WITH_AS(ref::topk(l, vec({0, 0}), vec({4, 4}), 2),
                       doctest::Contains("NaN at row 1, column 2"), Error);
  CHECK_NOTHROW(ref::topk(l, vec({0, 0}), vec({4, 2}), 2));  // NaN outside the window is ignored
  CHECK_THROWS_AS(ref::topk(l, vec({0, 0}), vec({4, 5}), 2), Error);
  CHECK_THROWS_AS(ref::topk(l, vec({0, 0}), vec({4, 4}), 0), Error);
  CHECK_THROWS_AS(ref::topk(l, vec({0}), vec({4}), 2), Error);
}

TEST_CASE("topk: local positions map back to kv rows") {
  Tensor<int32_t> local({2, 3});
  local.data = {2, 0, -1, 1, -1, -1};
  Tensor<int32_t> rows = ref::local_to_kv_rows(local, vec({0, 10}));
  CHECK(rows.shape == Shape{2, 1, 3});
  CHECK(rows.data == std::vector<int32_t>{2, 0, -1, 11, -1, -1});
}
