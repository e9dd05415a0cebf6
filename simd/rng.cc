// indexshare simd/: the generator's fills (ref/rng.h fill_range, fill_range_bf16) with several
// chunks' streams in vector lanes, the same values as ref's.
//
// Each chunk of kChunk elements of a stream has its own xoshiro256** generator (ref/rng.h), so
// chunks are independent: lane l of a vector of 64-bit lanes runs chunk c0 + l's generator, step
// for step as ref's scalar one (its four state words in four vectors; x * 5 and x * 9 as shifts
// and adds, the same bits mod 2^64), and step j of the lanes gives element j of each chunk. The
// int -> float mappings of the distributions without rejection (uniform, normal) are exact
// integers converted exactly and then the f32 multiplies of ref's draw (x * 2^-k, then * scale),
// one rounding each as there; bf16 is ref's f32_to_bf16 lane by lane. The distributions drawn by
// rejection (int, dyadic, ties, narrow: a lane may consume a different number of outputs) and the
// partial chunks at the ends of a range take ref's scalar fill. OpenMP over groups of chunks: the
// bytes never depend on the thread count or the target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/rng.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cstdint>
#include <cstring>

#include "ref/numerics.h"
#include "ref/rng.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DU64 = hn::ScalableTag<uint64_t>;
using VU64 = hn::Vec<DU64>;

// The lanes of this target: chunks per group.
int64_t GroupChunks() { return int64_t(hn::Lanes(DU64())); }

// xoshiro256** in lanes: ref's Xoshiro256::next (rng.cc), every lane its own generator.
struct Lanes4 {
  VU64 s0, s1, s2, s3;
  HWY_INLINE VU64 Next() {
    const VU64 x5 = hn::Add(s1, hn::ShiftLeft<2>(s1));          // s1 * 5
    const VU64 r = hn::RotateRight<57>(x5);                      // rotl(., 7)
    const VU64 result = hn::Add(r, hn::ShiftLeft<3>(r));         // * 9
    const VU64 t = hn::ShiftLeft<17>(s1);
    s2 = hn::Xor(s2, s0);
    s3 = hn::Xor(s3, s1);
    s1 = hn::Xor(s1, s2);
    s0 = hn::Xor(s0, s3);
    s2 = hn::Xor(s2, t);
    s3 = hn::RotateRight<19>(s3);                                // rotl(., 45)
    return result;
  }
};

constexpr int64_t kBlock = 64;  // steps per transposition block

// Chunks c0 .. c0 + L - 1 (L = GroupChunks(), whole chunks) of stream (seed, tag): element j of
// chunk c0 + l into out32[l * kChunk + j] (f32) or, when out16 is given, its bf16 bits into
// out16[l * kChunk + j]. kNormal: the normal draw, else the uniform one (ref's draw_inline).
template <bool kNormal>
void FillGroupT(uint64_t seed, uint64_t tag, int64_t c0, float scale, float* HWY_RESTRICT out32,
                uint16_t* HWY_RESTRICT out16) {
  const DU64 du;
  const hn::RebindToSigned<DU64> di;
  const hn::Rebind<double, DU64> dd;
  const hn::Rebind<float, DU64> df;
  const hn::Rebind<uint32_t, DU64> du32;
  const hn::Rebind<int32_t, DU64> di32;
  const hn::Rebind<uint16_t, DU64> du16;
  constexpr size_t kMax = HWY_LANES(uint64_t);
  const size_t L = hn::Lanes(du);
  HWY_ALIGN uint64_t st[4][kMax];
  for (size_t l = 0; l < L; ++l) {
    uint64_t s[4];
    chunk_generator(seed, tag, c0 + int64_t(l)).state(s);
    for (int w = 0; w < 4; ++w) st[w][l] = s[w];
  }
  Lanes4 g{hn::Load(du, st[0]), hn::Load(du, st[1]), hn::Load(du, st[2]), hn::Load(du, st[3])};
  const auto unit = hn::Set(df, kNormal ? 0x1p-16f : 0x1p-23f), sc = hn::Set(df, scale);
  const VU64 mask16 = hn::Set(du, 0x0000FFFF0000FFFFull), mask32 = hn::Set(du, 0xFFFFFFFFull);
  HWY_ALIGN float tmp32[kBlock * kMax];
  HWY_ALIGN uint16_t tmp16[kBlock * kMax];
  for (int64_t j0 = 0; j0 < kChunk; j0 += kBlock) {
    for (int64_t j = 0; j < kBlock; ++j) {
      hn::Vec<decltype(di)> x;
      if constexpr (kNormal) {
        // Twelve 16-bit fields of three outputs, summed (an integer in [0, 786420]), minus the mean:
        // fields 0 + 1 and 2 + 3 of each output in the low and high 32 bits of `pairs` (each
        // at most 6 * 65535 over the three outputs, so neither half carries), then the halves.
        VU64 pairs = hn::Zero(du);
        for (int i = 0; i < 3; ++i) {
          const VU64 r = g.Next();
          pairs = hn::Add(pairs, hn::Add(hn::And(r, mask16), hn::And(hn::ShiftRight<16>(r), mask16)));
        }
        const VU64 sum = hn::Add(hn::And(pairs, mask32), hn::ShiftRight<32>(pairs));
        x = hn::Sub(hn::BitCast(di, sum), hn::Set(di, 393210));
      } else {
        x = hn::Sub(hn::BitCast(di, hn::ShiftRight<40>(g.Next())), hn::Set(di, int64_t(1) << 23));
      }
      // |x| < 2^24: exact in double and in f32; then ref's two f32 multiplies.
      const auto v = hn::Mul(hn::Mul(hn::DemoteTo(df, hn::ConvertTo(dd, x)), unit), sc);
      if (out16) {
        // ref's f32_to_bf16: round to nearest even on the bits; NaN -> 0x7FC0 with the sign.
        const auto u = hn::BitCast(du32, v);
        const auto hi = hn::ShiftRight<16>(u);
        const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du32, 0x7FFFu)), hn::And(hi, hn::Set(du32, 1u))));
        const auto nan = hn::Or(hn::And(hi, hn::Set(du32, 0x8000u)), hn::Set(du32, 0x7FC0u));
        const auto is_nan = hn::Gt(hn::BitCast(di32, hn::And(u, hn::Set(du32, 0x7FFFFFFFu))), hn::Set(di32, 0x7F800000));
        const auto bits = hn::IfThenElse(hn::RebindMask(du32, is_nan), nan, rounded);  // <= 0xFFFF
        hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, bits)), du16, tmp16 + j * int64_t(L));
      } else {
        hn::StoreU(v, df, tmp32 + j * int64_t(L));
      }
    }
    for (size_t l = 0; l < L; ++l) {
      if (out16) {
        uint16_t* o = out16 + int64_t(l) * kChunk + j0;
        for (int64_t j = 0; j < kBlock; ++j) o[j] = tmp16[j * int64_t(L) + int64_t(l)];
      } else {
        float* o = out32 + int64_t(l) * kChunk + j0;
        for (int64_t j = 0; j < kBlock; ++j) o[j] = tmp32[j * int64_t(L) + int64_t(l)];
      }
    }
  }
}

void FillGroup(bool normal, uint64_t seed, uint64_t tag, int64_t c0, float scale, float* out32, uint16_t* out16) {
  if (normal) FillGroupT<true>(seed, tag, c0, scale, out32, out16);
  else FillGroupT<false>(seed, tag, c0, scale, out32, out16);
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <type_traits>

#include "ref/error.h"
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(GroupChunks);
HWY_EXPORT(FillGroup);

namespace {

// The fill of elements [start, start + n) of a stream into out (f32, or bf16 when Out is bf16_t):
// the whole chunks in groups of lanes, the rest (partial chunks, a remainder of fewer chunks than
// lanes, the distributions drawn by rejection) by ref's fill.
template <class Out>
void fill_lanes(Out* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag) {
  require(start >= 0 && n >= 0, "fill_range: start and n must be >= 0");
  auto scalar = [&](int64_t lo, int64_t hi) {
    if (hi <= lo) return;
    if constexpr (std::is_same_v<Out, float>) indexshare::fill_range(out + (lo - start), lo, hi - lo, dist, scale, seed, tag);
    else indexshare::fill_range_bf16(out + (lo - start), lo, hi - lo, dist, scale, seed, tag);
  };
  const int64_t end = start + n;
  const int64_t L = HWY_DYNAMIC_DISPATCH(GroupChunks)();
  const int64_t c_lo = (start + kChunk - 1) / kChunk, c_hi = end / kChunk;  // the whole chunks
  const int64_t groups = c_hi > c_lo ? (c_hi - c_lo) / L : 0;
  if ((dist != Dist::uniform && dist != Dist::normal) || groups == 0 || L < 2) return scalar(start, end);
  const int64_t g_lo = c_lo * kChunk, g_hi = (c_lo + groups * L) * kChunk;  // [g_lo, g_hi): the groups
  scalar(start, g_lo);
#pragma omp parallel for schedule(static) if (groups >= 2)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = c_lo + g * L, off = c0 * kChunk - start;
    if constexpr (std::is_same_v<Out, float>)
      HWY_DYNAMIC_DISPATCH(FillGroup)(dist == Dist::normal, seed, tag, c0, scale, out + off, nullptr);
    else
      HWY_DYNAMIC_DISPATCH(FillGroup)(dist == Dist::normal, seed, tag, c0, scale, nullptr,
                                      reinterpret_cast<uint16_t*>(out + off));
  }
  scalar(g_hi, end);
}

}  // namespace

void fill_range(float* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag) {
  fill_lanes(out, start, n, dist, scale, seed, tag);
}

void fill_range_bf16(bf16_t* out, int64_t start, int64_t n, Dist dist, float scale, uint64_t seed, uint64_t tag) {
  fill_lanes(out, start, n, dist, scale, seed, tag);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
