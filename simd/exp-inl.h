// indexshare simd/: ref's exp_portable (ref/numerics.h) lane by lane.
//
// Each lane performs the operations of the scalar function in the same order, so the results are
// equal bit for bit on every target:
//   clamp       Min/Max with the same bounds (NaN lanes are restored at the end, as ref returns
//               NaN unchanged before any arithmetic)
//   reduce      Round (to nearest, ties to even, like std::nearbyint in the default rounding mode),
//               then the same separate multiplies and subtractions
//   polynomial  Horner with a separate Mul and Add per step (never MulAdd: ref does not fuse)
//   scale       (p * 2^k1) * 2^k2 with k1 = floor(k / 2), k2 = k - k1, each power of two built from
//               its exponent bits. |k| <= 1076 keeps both powers normal and p * 2^k1 exact, so the
//               second multiply is the single rounding that std::ldexp(p, k) performs.

#if defined(INDEXSHARE_SIMD_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef INDEXSHARE_SIMD_EXP_INL_H_
#undef INDEXSHARE_SIMD_EXP_INL_H_
#else
#define INDEXSHARE_SIMD_EXP_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "ref/numerics.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2^e for integral e in [-1022, 1023] (as doubles), from the exponent bits.
template <class D>
HWY_INLINE hn::Vec<D> Pow2(D d, hn::Vec<D> e) {
  const hn::RebindToSigned<D> di;
  const auto bits = hn::ShiftLeft<52>(hn::Add(hn::ConvertTo(di, e), hn::Set(di, int64_t{1023})));
  return hn::BitCast(d, bits);
}

template <class D>
HWY_INLINE hn::Vec<D> ExpPortable(D d, hn::Vec<D> x) {
  const auto is_nan = hn::IsNaN(x);
  const auto xc = hn::Min(hn::Max(x, hn::Set(d, kExpLo)), hn::Set(d, kExpHi));
  const auto k = hn::Round(hn::Mul(xc, hn::Set(d, kLog2e)));
  const auto r = hn::Sub(hn::Sub(xc, hn::Mul(k, hn::Set(d, kLn2Hi))), hn::Mul(k, hn::Set(d, kLn2Lo)));
  auto p = hn::Set(d, kExpCoefficients[kExpDegree]);
  for (int n = kExpDegree - 1; n >= 0; --n) p = hn::Add(hn::Mul(p, r), hn::Set(d, kExpCoefficients[size_t(n)]));
  const auto k1 = hn::Floor(hn::Mul(k, hn::Set(d, 0.5)));
  const auto k2 = hn::Sub(k, k1);
  const auto y = hn::Mul(hn::Mul(p, Pow2(d, k1)), Pow2(d, k2));
  return hn::IfThenElse(is_nan, x, y);
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
