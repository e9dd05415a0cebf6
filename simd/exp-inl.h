// indexshare simd/: ref's exp_portable (ref/numerics.h) lane by lane.
//
// Each lane performs the operations of the scalar function in the same order, so the results are
// equal bit for bit on every target:
//   clamp       Min/Max with the same bounds (NaN lanes are restored at the end, as ref returns
//               NaN unchanged before any arithmetic)
//   reduce      k = nearbyint(x * log2e) by the shifter 1.5 * 2^52: |x * log2e| < 1078, so the sum
//               lies in [2^52, 2^53), where the spacing is 1 and the addition rounds to the nearest
//               integer, ties to even, like std::nearbyint in the default rounding mode; subtracting
//               the shifter back is exact, and the sum's bits minus the shifter's are k as an
//               integer (k may come out +0 where nearbyint gives -0: x - (+-0) * c is the same for
//               x != 0, and x = -0 gives r = +-0, which the polynomial maps to the same p). Then
//               the same separate multiplies and subtractions
//   polynomial  Horner with a separate Mul and Add per step (never MulAdd: ref does not fuse)
//   scale       (p * 2^k1) * 2^k2 with k1 = floor(k / 2) (an arithmetic shift of the integer k),
//               k2 = k - k1, each power of two built from its exponent bits. |k| <= 1076 keeps
//               both powers normal and p * 2^k1 exact, so the second multiply is the single
//               rounding that std::ldexp(p, k) performs.

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

// 2^e for integral e in [-1022, 1023] (64-bit integer lanes), from the exponent bits.
template <class D>
HWY_INLINE hn::Vec<D> Pow2(D d, hn::Vec<hn::RebindToSigned<D>> e) {
  const hn::RebindToSigned<D> di;
  return hn::BitCast(d, hn::ShiftLeft<52>(hn::Add(e, hn::Set(di, int64_t{1023}))));
}

template <class D>
HWY_INLINE hn::Vec<D> ExpPortable(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  const auto is_nan = hn::IsNaN(x);
  const auto xc = hn::Min(hn::Max(x, hn::Set(d, kExpLo)), hn::Set(d, kExpHi));
  const auto shifter = hn::Set(d, 0x1.8p52);
  const auto s = hn::Add(hn::Mul(xc, hn::Set(d, kLog2e)), shifter);
  const auto k = hn::Sub(s, shifter);
  const auto ki = hn::Sub(hn::BitCast(di, s), hn::BitCast(di, shifter));
  const auto r = hn::Sub(hn::Sub(xc, hn::Mul(k, hn::Set(d, kLn2Hi))), hn::Mul(k, hn::Set(d, kLn2Lo)));
  auto p = hn::Set(d, kExpCoefficients[kExpDegree]);
  for (int n = kExpDegree - 1; n >= 0; --n) p = hn::Add(hn::Mul(p, r), hn::Set(d, kExpCoefficients[size_t(n)]));
  const auto k1 = hn::ShiftRight<1>(ki);  // floor(k / 2)
  const auto k2 = hn::Sub(ki, k1);
  const auto y = hn::Mul(hn::Mul(p, Pow2(d, k1)), Pow2(d, k2));
  return hn::IfThenElse(is_nan, x, y);
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
