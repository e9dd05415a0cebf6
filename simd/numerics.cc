// indexshare simd/: the FP8 quantization of generated tensors (ref/numerics.h quantize_rows and
// f32_to_e4m3), in lanes, with ref's bytes.
//
// f32_to_e4m3 lane by lane, on the integer bits as ref's (ref/numerics.cc), for any f32:
//   ef, mf     the f32 exponent and mantissa fields; sig = mf | 2^23 (ef >= 1)
//   shift      20 on the e4m3 normal grid (ef >= 121, i.e. |x| >= 2^-6), 141 - ef on the
//              subnormal grid, capped at 25: from there on sig < 2^24 <= half, so r = 0 either way
//   r          sig / 2^shift to nearest, ties to even: (sig + half - 1 + lsb) >> shift, where
//              lsb is the lowest kept bit (a remainder above half, or at half with lsb 1, carries)
//   magnitude  subnormal grid: r; normal grid: (ef - 120) * 8 + r - 8, so r = 16 carries into the
//              exponent field by itself, and anything above 0x7E (exponent field 15 with mantissa
//              7, or more) saturates to 0x7E (448)
//   ef == 0 (zero and f32 subnormals, all below half the smallest e4m3 step): the sign alone;
//   ef == 255: NaN 0x7F, infinity 0x7E, with the sign.
// quantize_rows: per row and block, amax = max |x| (exact in any order), ref's block_scale (scalar),
// then y = min(max(x / s, -448), 448) (one IEEE division, as ref) and its code. OpenMP over rows:
// each row has its own codes and scales, so the thread count never changes a byte. A non-finite
// value anywhere leaves the rows as they are and throws ref's error (ref names the first one).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/numerics.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ref/numerics.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using D8 = hn::Rebind<uint8_t, DF>;

// ref's f32_to_e4m3 of every lane (see the header), as 32-bit lanes holding the code.
HWY_INLINE hn::Vec<DU> E4m3Codes(hn::Vec<DF> x) {
  const DU du;
  const DI di;
  const auto u = hn::BitCast(du, x);
  const auto sign = hn::And(hn::ShiftRight<24>(u), hn::Set(du, 0x80u));
  const auto ef = hn::BitCast(di, hn::And(hn::ShiftRight<23>(u), hn::Set(du, 0xFFu)));
  const auto mf = hn::And(u, hn::Set(du, 0x7FFFFFu));
  const auto sig = hn::Or(mf, hn::Set(du, 0x800000u));
  const auto shift = hn::BitCast(du, hn::Min(hn::Max(hn::Sub(hn::Set(di, 141), ef), hn::Set(di, 20)), hn::Set(di, 25)));
  const auto half = hn::Set(du, 1u) << hn::Sub(shift, hn::Set(du, 1u));
  const auto lsb = hn::And(sig >> shift, hn::Set(du, 1u));
  const auto r = hn::Add(hn::Add(sig, hn::Sub(half, hn::Set(du, 1u))), lsb) >> shift;
  const auto normal = hn::BitCast(du, hn::Add(hn::ShiftLeft<3>(hn::Sub(ef, hn::Set(di, 120))), hn::Sub(hn::BitCast(di, r), hn::Set(di, 8))));
  auto mag = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ef, hn::Set(di, 121))), r,
                            hn::BitCast(du, hn::Min(hn::BitCast(di, normal), hn::Set(di, 0x7E))));
  mag = hn::IfThenZeroElse(hn::RebindMask(du, hn::Eq(ef, hn::Zero(di))), mag);
  const auto special = hn::IfThenElse(hn::RebindMask(du, hn::Eq(mf, hn::Zero(du))), hn::Set(du, 0x7Eu), hn::Set(du, 0x7Fu));
  mag = hn::IfThenElse(hn::RebindMask(du, hn::Eq(ef, hn::Set(di, 255))), special, mag);
  return hn::Or(sign, mag);
}

void F32ToE4m3(const float* HWY_RESTRICT x, int64_t n, uint8_t* HWY_RESTRICT codes) {
  const DF df;
  const D8 d8;
  const int64_t N = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::U8FromU32(E4m3Codes(hn::LoadU(df, x + i))), d8, codes + i);
  for (; i < n; ++i) codes[i] = f32_to_e4m3(x[i]).bits;
}

// Rows [r0, r1) of quantize_rows (see the header); returns false, leaving the row's codes and
// scales unwritten, at a row holding a non-finite value.
bool QuantizeRows(const float* HWY_RESTRICT x, int64_t r0, int64_t r1, int64_t cols, int block, ScaleRule rule,
                  uint8_t* HWY_RESTRICT codes, float* HWY_RESTRICT scales) {
  const DF df;
  const DI di;
  const D8 d8;
  const int64_t N = int64_t(hn::Lanes(df)), nblocks = (cols + block - 1) / block;
  bool finite = true;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols;
    // Finiteness of the row: the largest exponent field (all ones: infinity or NaN).
    auto emax = hn::Zero(di);
    int32_t emax_tail = 0;
    int64_t c = 0;
    for (; c + N <= cols; c += N)
      emax = hn::Max(emax, hn::And(hn::BitCast(di, hn::LoadU(df, xr + c)), hn::Set(di, 0x7F800000)));
    for (; c < cols; ++c) emax_tail = std::max(emax_tail, std::isfinite(xr[c]) ? 0 : 0x7F800000);
    if (hn::GetLane(hn::MaxOfLanes(di, emax)) == 0x7F800000 || emax_tail != 0) {
      finite = false;
      continue;
    }
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t c0 = b * block, c1 = std::min<int64_t>(cols, c0 + block);
      auto vmax = hn::Zero(df);
      float amax = 0.0f;
      for (c = c0; c + N <= c1; c += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xr + c)));
      for (; c < c1; ++c) amax = std::fmax(amax, std::fabs(xr[c]));
      amax = std::fmax(amax, hn::GetLane(hn::MaxOfLanes(df, vmax)));
      const float s = block_scale(amax, rule);
      scales[r * nblocks + b] = s;
      const auto vs = hn::Set(df, s), lo = hn::Set(df, -kE4m3Max), hi = hn::Set(df, kE4m3Max);
      for (c = c0; c + N <= c1; c += N) {
        const auto y = hn::Min(hn::Max(hn::Div(hn::LoadU(df, xr + c), vs), lo), hi);
        hn::StoreU(hn::U8FromU32(E4m3Codes(y)), d8, codes + r * cols + c);
      }
      for (; c < c1; ++c) codes[r * cols + c] = f32_to_e4m3(std::fmin(std::fmax(xr[c] / s, -kE4m3Max), kE4m3Max)).bits;
    }
  }
  return finite;
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ref/error.h"
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(F32ToE4m3);
HWY_EXPORT(QuantizeRows);

void f32_to_e4m3(const float* x, int64_t n, e4m3_t* codes) {
  static_assert(sizeof(e4m3_t) == 1);
  if (n > 0) HWY_DYNAMIC_DISPATCH(F32ToE4m3)(x, n, reinterpret_cast<uint8_t*>(codes));
}

void quantize_rows(const float* x, int64_t rows, int64_t cols, int block, ScaleRule rule, e4m3_t* codes,
                   float* scales, const std::string& what) {
  require(block > 0, what + ": quantization block must be positive");
  if (rows <= 0 || cols <= 0) return;
  // Rows in parallel, a few hundred KB of input per task; a row with a non-finite value is left
  // unwritten and ref's check, run afterwards, throws its error for the first one.
  const int64_t per = std::max<int64_t>(1, (int64_t(1) << 16) / cols);
  const int64_t tasks = (rows + per - 1) / per;
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite) if (tasks >= 2)
  for (int64_t i = 0; i < tasks; ++i)
    finite = HWY_DYNAMIC_DISPATCH(QuantizeRows)(x, i * per, std::min(rows, (i + 1) * per), cols, block, rule,
                                                reinterpret_cast<uint8_t*>(codes), scales) && finite;
  if (!finite) indexshare::quantize_rows(x, rows, cols, block, rule, codes, scales, what);  // throws
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
