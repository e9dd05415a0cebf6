// indexshare simd/: indexer_logits_rule, the per-element bounds of the indexer logits (ref/bounds.cc's),
// bit-identical to ref's. The logits magnitudes run in lanes: Qt = sum_h |w| |q| with lanes over d
// (h ascending), then lanes over keys s (|k| transposed to [d][s]), d ascending; each sum keeps ref's
// order (simd/compare.cc's header: independent sums in the lanes, never one sum across lanes).
// OpenMP splits over query rows only (independent outputs); the rule's two global sums (sum b^2,
// sum 2 r^2) run afterwards in ref's order on one thread.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/compare_logits.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "ref/bounds.h"
#include "ref/numerics.h"
#include "simd/common.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;


HWY_INLINE int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

using DF64 = hn::ScalableTag<double>;
using VF64 = hn::Vec<DF64>;

// ---- the indexer logits rule (double) ----------------------------------------------------------

// Per lane (key s): mag = sum_d Qt[d] * |k_sd|, d ascending, a multiply then an add (Qt is a full
// double: the product rounds, as in ref), for kV vectors of keys (kt[d * sp + s], |k| transposed in
// a tile of keys: sp is the tile's width).
template <size_t kV>
HWY_INLINE void LogitMagTile(const double* HWY_RESTRICT qt, int64_t D, const double* HWY_RESTRICT kt, int64_t sp,
                             double* HWY_RESTRICT mag_out) {
  const DF64 d64;
  const size_t N = hn::Lanes(d64);
  VF64 m[kV];
  for (size_t u = 0; u < kV; ++u) m[u] = hn::Zero(d64);
  for (int64_t d = 0; d < D; ++d) {
    const VF64 q = hn::Set(d64, qt[d]);
    for (size_t u = 0; u < kV; ++u) m[u] = hn::Add(m[u], hn::Mul(q, hn::LoadU(d64, kt + d * sp + int64_t(u * N))));
  }
  for (size_t u = 0; u < kV; ++u) hn::StoreU(m[u], d64, mag_out + int64_t(u * N));
}

constexpr size_t kMagVecs = 4;  // vectors of keys per tile
constexpr int64_t kMagTile = 64;  // keys per tile of |k| (indexer_logits_rule's layout)
static_assert(kMagTile % (kMagVecs * HWY_LANES(double)) == 0, "indexer_logits_rule's tiles are 64 keys");

// Rows [t0, t1) of the logits bound (ref's indexer_logits_rule, without its global sums): q8 codes
// [s_q, H, D], kt = |k| transposed by tiles of kMagTile keys, [sp / kMagTile][D][kMagTile] (sp =
// s_kv padded to whole tiles, zeros past s_kv): a tile is contiguous and stays in L1/L2 while the
// row's Qt sweeps it.
void LogitsBoundChunk(const uint8_t* q8, const double* kt, int64_t sp, const float* k_scale, const float* weights,
                      const float* exact, int64_t H, int64_t D, int64_t s_kv, int64_t t0, int64_t t1, float* bound) {
  const DF64 d64;
  const int64_t N = int64_t(hn::Lanes(d64));
  const int64_t sw = int64_t(kMagVecs) * N;
  const double* e4 = detail::e4m3_table();
  const int64_t Dp = RoundUp(D, N);
  auto qt = hwy::AllocateAligned<double>(size_t(Dp));
  std::vector<double> qa(static_cast<size_t>(Dp));
  auto mag = hwy::AllocateAligned<double>(size_t(sp));
  const double C = cmp::logits_bound_coefficient(D, H);
  for (int64_t t = t0; t < t1; ++t) {
    // Qt[d] = sum_h |w_h| |q_hd|, h ascending, lanes over d: the product of an f32 and an e4m3
    // value is exact in double, so ref's multiply-then-add is one fused multiply-add.
    std::fill(qt.get(), qt.get() + Dp, 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const VF64 w = hn::Set(d64, std::fabs(double(weights[t * H + h])));
      const uint8_t* qh = q8 + (t * H + h) * D;
      for (int64_t d = 0; d < D; ++d) qa[size_t(d)] = std::fabs(e4[qh[d]]);
      for (int64_t d = 0; d < Dp; d += N)
        hn::Store(hn::MulAdd(w, hn::LoadU(d64, qa.data() + d), hn::Load(d64, qt.get() + d)), d64, qt.get() + d);
    }
    // Only the tiles holding finite logits (the row's window; ref skips the others, bound 0).
    int64_t s_lo = 0, s_hi = s_kv;
    while (s_lo < s_kv && !std::isfinite(exact[t * s_kv + s_lo])) ++s_lo;
    while (s_hi > s_lo && !std::isfinite(exact[t * s_kv + s_hi - 1])) --s_hi;
    for (int64_t s0 = s_lo / sw * sw; s0 < s_hi; s0 += sw)
      LogitMagTile<kMagVecs>(qt.get(), D, kt + s0 / kMagTile * D * kMagTile + s0 % kMagTile, kMagTile, mag.get() + s0);
    for (int64_t s = 0; s < s_kv; ++s) {
      const double r = exact[t * s_kv + s];
      // ref: logits_bound_coefficient(D, H) * k_scale * mag, left to right.
      bound[t * s_kv + s] = std::isfinite(r) ? cmp::bound_f32(C * double(k_scale[s]) * mag[size_t(s)]) : 0.0f;
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

namespace indexshare::simd {

HWY_EXPORT(LogitsBoundChunk);

cmp::FloatRule indexer_logits_rule(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                                   const Tensor<float>& weights, const Tensor<float>& exact_logits) {
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  cmp::FloatRule rule;
  rule.bound.assign(size_t(s_q * s_kv), 0.0f);
  // |k| transposed by tiles of 64 keys, [sp / 64][D][64], sp a multiple of 64 keys, a whole
  // number of tiles on every target (zeros past s_kv).
  const int64_t sp = (s_kv + 63) / 64 * 64;
  auto kt = hwy::AllocateAligned<double>(size_t(D * sp));
  const double* e4 = detail::e4m3_table();
  const uint8_t* k8 = reinterpret_cast<const uint8_t*>(k.ptr());
#pragma omp parallel for schedule(static)
  for (int64_t tile = 0; tile < sp / 64; ++tile)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < 64; ++j) {
        const int64_t s = tile * 64 + j;
        kt[size_t((tile * D + d) * 64 + j)] = s < s_kv ? std::fabs(e4[k8[s * D + d]]) : 0.0;
      }
  const uint8_t* q8 = reinterpret_cast<const uint8_t*>(q.ptr());
  detail::over_rows(s_q, 4, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(LogitsBoundChunk)(q8, kt.get(), sp, k_scale.ptr(), weights.ptr(), exact_logits.ptr(), H, D,
                                           s_kv, t0, t1, rule.bound.data());
  });
  // The global sums in ref's order (t, then s ascending).
  double sum_b2 = 0, sum_r2 = 0;
  for (int64_t i = 0; i < s_q * s_kv; ++i) {
    const double r = exact_logits[i];
    if (!std::isfinite(r)) continue;
    const double b = rule.bound[size_t(i)];
    sum_b2 += b * b;
    sum_r2 += 2 * r * r;
  }
  rule.metric_max = sum_r2 > 0 ? sum_b2 / sum_r2 : 0;
  rule.derivation = cmp::kLogitsDerivation;
  return rule;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
