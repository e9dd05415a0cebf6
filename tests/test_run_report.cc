// Tests of run's per-layer line (tools/lib/run_report.h): the recall of each row against its
// definition on std::set, the same for 1 and 2 threads; the output's fold (sum of squares and
// FNV-1a over the f32 words, in lanes) the same whether the output arrives whole or in pieces (as
// MPI ranks fold it), equal to the plain definition, and changed by a one-bit change.
#include <doctest/doctest.h>

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "ref/rng.h"
#include "tools/lib/run_report.h"

using namespace indexshare;

TEST_CASE("run_report: recall_rows is |A ∩ B| / |A| over the rows' valid entries as sets, for any thread count") {
  const int64_t rows = 200, k = 37;
  Tensor<int32_t> a({rows, k}), b({rows, k});
  Xoshiro256 r(5);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < k; ++j) {
      // Small ranges: repeats within a row, overlaps between a and b; -1 padding; row 3 all -1 in a.
      a.at(t, j) = r.below(8) == 0 || t == 3 ? -1 : int32_t(r.below(60));
      b.at(t, j) = r.below(8) == 0 ? -1 : int32_t(r.below(60));
    }
  std::vector<double> want;
  for (int64_t t = 0; t < rows; ++t) {
    std::set<int32_t> sa, sb;
    for (int64_t j = 0; j < k; ++j) {
      if (a.at(t, j) >= 0) sa.insert(a.at(t, j));
      if (b.at(t, j) >= 0) sb.insert(b.at(t, j));
    }
    int64_t common = 0;
    for (int32_t v : sa) common += int64_t(sb.count(v));
    want.push_back(sa.empty() ? 1.0 : double(common) / double(sa.size()));
  }
  CHECK(want[3] == 1.0);
  const int before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    CHECK(run_report::recall_rows(a, b) == want);
  }
  omp_set_num_threads(before);
}

TEST_CASE("run_report: the output's fold is the same whole or in pieces, and is its definition over lanes") {
  std::vector<float> out(1001);
  Xoshiro256 r(9);
  for (float& v : out) v = float(double(int64_t(r.below(1u << 20)) - (1 << 19)) / double(1 << 17));
  run_report::LayerFold whole, pieces;
  whole.add_out(out);
  // Pieces that start off the lane boundary (as MPI ranks' row blocks may).
  pieces.add_out(std::span<const float>(out).subspan(0, 333));
  pieces.add_out(std::span<const float>(out).subspan(333, 1));
  pieces.add_out(std::span<const float>(out).subspan(334, 5));
  pieces.add_out(std::span<const float>(out).subspan(339));
  CHECK(whole.fp() == pieces.fp());
  const double a = whole.ss(), b = pieces.ss();
  CHECK(std::memcmp(&a, &b, sizeof(double)) == 0);
  CHECK(whole.numel == 1001);
  // The definition: lane j holds elements j, j + 8, ...; FNV-1a per lane over the f32 words, then
  // FNV-1a over the lanes' hashes (8 little-endian bytes each, lane order); the sum of squares
  // per lane in element order, the lanes added in order.
  constexpr uint64_t basis = 0xCBF29CE484222325ull, prime = 0x100000001B3ull;
  uint64_t lane_h[8];
  double lane_s[8] = {};
  for (uint64_t& h : lane_h) h = basis;
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t w;
    std::memcpy(&w, &out[i], 4);
    lane_h[i % 8] = (lane_h[i % 8] ^ w) * prime;
    lane_s[i % 8] += double(out[i]) * double(out[i]);
  }
  uint64_t h = basis;
  double ss = 0;
  for (int j = 0; j < 8; ++j) {
    for (int k = 0; k < 8; ++k) h = (h ^ ((lane_h[j] >> (8 * k)) & 0xFF)) * prime;
    ss += lane_s[j];
  }
  CHECK(whole.fp() == h);
  CHECK(whole.ss() == ss);
  // One bit of one element changes the fingerprint; the line prints it.
  std::vector<float> flipped = out;
  uint32_t w;
  std::memcpy(&w, &flipped[500], 4);
  w ^= 1u;
  std::memcpy(&flipped[500], &w, 4);
  run_report::LayerFold other;
  other.add_out(flipped);
  CHECK(other.fp() != whole.fp());
  CHECK(run_report::layer_line(2, false, 1, true, whole) != run_report::layer_line(2, false, 1, true, other));
}
