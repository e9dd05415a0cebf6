// Tests of ref/rng: the engine against its published definition, the distributions' ranges and
// moments, exactness of the "exact" distributions, and chunked filling.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "ref/layer.h"
#include "ref/numerics.h"
#include "ref/rng.h"

using namespace indexshare;

TEST_CASE("rng: SplitMix64 and xoshiro256** match their reference definitions") {
  // SplitMix64 from state 0: first output of the reference C implementation (Vigna, prng.di.unimi.it).
  uint64_t st = 0;
  CHECK(splitmix64(st) == 0xE220A8397B1DCDAFull);
  // xoshiro256** from state {1, 2, 3, 4}: the first outputs, computed by hand from
  // result = rotl(s1 * 5, 7) * 9 with the state update of the reference implementation.
  Xoshiro256 g = Xoshiro256::from_state(1, 2, 3, 4);
  CHECK(g.next() == 11520ull);              // rotl(10, 7) * 9 = 1280 * 9
  CHECK(g.next() == 0ull);                  // s1 became 0 after the first update
  CHECK(g.next() == 1509978240ull);
  CHECK(g.next() == 1215971899390074240ull);
}

TEST_CASE("rng: below(n) is uniform and in range") {
  Xoshiro256 g(42);
  std::map<uint64_t, int> counts;
  const int n = 70000;
  for (int i = 0; i < n; ++i) {
    const uint64_t v = g.below(7);
    REQUIRE(v < 7);
    ++counts[v];
  }
  // Each bucket expects n/7 = 10000 with standard deviation sqrt(n p (1-p)) ~ 93: allow 6 sigma.
  for (auto& [v, c] : counts) CHECK(std::abs(c - n / 7) < 560);
  CHECK(counts.size() == 7);
}

TEST_CASE("rng: distributions have their stated ranges, moments and exactness") {
  const int64_t n = 200000;
  std::vector<float> x(static_cast<size_t>(n));
  for (Dist d : {Dist::uniform, Dist::normal, Dist::integer, Dist::dyadic, Dist::ties, Dist::narrow}) {
    CAPTURE(dist_name(d));
    fill(x.data(), n, d, 1.0f, 7, stream_tag("t"));
    double sum = 0, sum2 = 0;
    std::set<float> distinct;
    for (float v : x) {
      sum += v;
      sum2 += double(v) * v;
      if (distinct.size() < 100) distinct.insert(v);
      switch (d) {
        case Dist::uniform: REQUIRE((v >= -1.0f && v < 1.0f)); break;
        case Dist::normal: REQUIRE(std::fabs(v) <= 6.0f); break;
        case Dist::integer: REQUIRE((v == std::round(v) && std::fabs(v) <= 4)); break;
        case Dist::dyadic: REQUIRE((v * 8 == std::round(v * 8) && std::fabs(v) <= 2)); break;
        case Dist::ties: REQUIRE((v == -1 || v == -0.5f || v == 0.5f || v == 1)); break;
        case Dist::narrow: REQUIRE(std::fabs(v - 1.0f) <= 8 * std::ldexp(1.0f, -12)); break;
      }
      if (d == Dist::integer || d == Dist::dyadic || d == Dist::ties) {
        REQUIRE(round_bf16(v) == v);
        REQUIRE(e4m3_to_f32(f32_to_e4m3(v)) == v);
      }
    }
    const double mean = sum / double(n), var = sum2 / double(n) - mean * mean;
    // Means: standard error sqrt(var / n) <= 0.005 for these variances; allow 6 standard errors.
    if (d == Dist::uniform) { CHECK(std::fabs(mean) < 0.01); CHECK(std::fabs(var - 1.0 / 3) < 0.01); }
    if (d == Dist::normal) { CHECK(std::fabs(mean) < 0.015); CHECK(std::fabs(var - 1.0) < 0.02); }
    if (d == Dist::integer) { CHECK(std::fabs(mean) < 0.05); CHECK(std::fabs(var - 60.0 / 9) < 0.1); }
    if (d == Dist::ties) CHECK(distinct.size() == 4);
  }
}

TEST_CASE("rng: filling is reproducible, stream-separated and independent of the length") {
  const int64_t n = 3 * kChunk + 17;
  std::vector<float> a(static_cast<size_t>(n)), b(a), c(a), prefix(static_cast<size_t>(kChunk + 5));
  fill(a.data(), n, Dist::normal, 2.0f, 11, stream_tag("layers.0.indexer.q"));
  fill(b.data(), n, Dist::normal, 2.0f, 11, stream_tag("layers.0.indexer.q"));
  CHECK(a == b);
  fill(c.data(), n, Dist::normal, 2.0f, 11, stream_tag("layers.0.indexer.k"));
  CHECK(a != c);
  fill(c.data(), n, Dist::normal, 2.0f, 12, stream_tag("layers.0.indexer.q"));
  CHECK(a != c);
  // The first kChunk + 5 values do not depend on how many values are filled: chunks are
  // seeded from their own index, so any split of the work gives the same numbers.
  fill(prefix.data(), int64_t(prefix.size()), Dist::normal, 2.0f, 11, stream_tag("layers.0.indexer.q"));
  CHECK(std::equal(prefix.begin(), prefix.end(), a.begin()));
  // Chunks differ from each other (no repeated seeding).
  CHECK(!std::equal(a.begin(), a.begin() + 64, a.begin() + kChunk));
  CHECK(parse_dist("ties") == Dist::ties);
  CHECK_THROWS_WITH_AS(parse_dist("gauss"), doctest::Contains("'gauss'"), Error);
}

TEST_CASE("rng: fill and fill_range give the same bytes on 1 and 2 threads (chunks filled in parallel)") {
  const uint64_t tag = stream_tag("threads");
  const int64_t n = 40 * kChunk + 123;  // past the parallel threshold, a partial last chunk
  std::vector<float> one(static_cast<size_t>(n)), two(static_cast<size_t>(n), -1.0f);
  std::vector<float> r1(static_cast<size_t>(20 * kChunk)), r2(r1.size(), -1.0f);
  const int before = omp_get_max_threads();
  for (const Dist d : {Dist::normal, Dist::integer}) {  // integer draws use rejection (variable draws)
    omp_set_num_threads(1);
    fill(one.data(), n, d, 0.5f, 7, tag);
    fill_range(r1.data(), 3 * kChunk + 17, int64_t(r1.size()), d, 0.5f, 7, tag);
    omp_set_num_threads(2);
    fill(two.data(), n, d, 0.5f, 7, tag);
    fill_range(r2.data(), 3 * kChunk + 17, int64_t(r2.size()), d, 0.5f, 7, tag);
    CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(r1.data(), one.data() + 3 * kChunk + 17, r1.size() * sizeof(float)) == 0);
  }
  omp_set_num_threads(before);
}

TEST_CASE("rng: fill_range equals the slice of a full fill, across chunk boundaries") {
  // An independent statement of the stream layout (ref/rng.h): chunk c's generator is seeded
  // from splitmix64 applied to (seed ^ 0x5DEECE66D) ^ tag ^ c, then draws in order.
  auto chunk_values = [](Dist d, uint64_t seed, uint64_t tag, int64_t c) {
    uint64_t st = seed ^ 0x5DEECE66Dull;
    st = splitmix64(st) ^ tag;
    st = splitmix64(st) ^ uint64_t(c);
    Xoshiro256 g(splitmix64(st));
    std::vector<float> v(static_cast<size_t>(kChunk));
    for (float& x : v) x = draw(g, d) * 0.5f;
    return v;
  };
  const uint64_t tag = stream_tag("layers.3.attn.q");
  for (Dist d : {Dist::normal, Dist::integer, Dist::narrow, Dist::ties}) {  // rejection (below) included
    CAPTURE(dist_name(d));
    const int64_t N = 5 * kChunk + 123;
    std::vector<float> full(static_cast<size_t>(N));
    fill(full.data(), N, d, 0.5f, 9, tag);
    for (int64_t c = 0; c < 5; ++c) {  // the full fill itself follows the layout
      const std::vector<float> ref = chunk_values(d, 9, tag, c);
      REQUIRE(std::equal(ref.begin(), ref.end(), full.begin() + c * kChunk));
    }
    Xoshiro256 pick(1234);
    std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 0}, {0, N}, {kChunk - 1, 2}, {kChunk, kChunk},
                                                       {3 * kChunk + 7, 2 * kChunk + 116}, {N - 1, 1}};
    for (int i = 0; i < 40; ++i) {
      const int64_t start = int64_t(pick.below(uint64_t(N)));
      ranges.push_back({start, int64_t(pick.below(uint64_t(N - start + 1)))});
    }
    for (const auto& [start, n] : ranges) {
      CAPTURE(start);
      CAPTURE(n);
      std::vector<float> part(static_cast<size_t>(n) + 1, -7.0f);  // one sentinel past the end
      fill_range(part.data(), start, n, d, 0.5f, 9, tag);
      CHECK(std::equal(part.begin(), part.begin() + n, full.begin() + start));
      CHECK(part.back() == -7.0f);
    }
  }
  std::vector<float> x(1);
  CHECK_THROWS_AS(fill_range(x.data(), -1, 1, Dist::normal, 1.0f, 1, tag), Error);
}

TEST_CASE("rng: generate_rows_bf16 equals bf16 of generate_rows (runs of rows, gaps, many chunks, 1 and 2 threads)") {
  // 40 rows of 1000 values: ~10 chunks of 4096 per run of rows (the parallel path), runs that start
  // and end inside a chunk; a rejection-sampling distribution (a variable number of draws per
  // value) and the default normal one.
  const int threads = omp_get_max_threads();
  for (Dist dist : {Dist::normal, Dist::integer}) {
    Problem p;
    p.dist = dist;
    p.seed = 77;
    const Shape shape{40, 10, 100};
    std::vector<int64_t> rows;
    for (int64_t t = 0; t < 40; ++t)
      if (t != 3 && t != 17 && t != 18) rows.push_back(t);
    std::vector<int64_t> all40(40);
    for (int64_t t = 0; t < 40; ++t) all40[size_t(t)] = t;
    for (const std::vector<int64_t>& rs : {rows, all40}) {
      const Tensor<float> f = ref::generate_rows(p, "x.y", shape, rs, 0.5f);
      for (int n : {1, 2}) {
        omp_set_num_threads(n);
        const Tensor<bf16_t> b = ref::generate_rows_bf16(p, "x.y", shape, rs, 0.5f);
        REQUIRE(b.shape == f.shape);
        int64_t diff = 0;
        for (int64_t i = 0; i < f.numel(); ++i) diff += b[i].bits != f32_to_bf16(f[i]).bits;
        CHECK(diff == 0);
      }
    }
  }
  omp_set_num_threads(threads);
}
