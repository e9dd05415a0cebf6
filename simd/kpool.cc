// indexshare simd/: GLM-5.3's pooled indexer keys (ref/kpool/pool.h pool_keys), with ref's bits.
//
// f32 rounding: channels in double lanes, one pool at a time, each lane performing ref's
// pool_channel sequence for its channel: m = max_j z (exact; the inputs are finite), e_j =
// ExpPortable(z_j - m) (simd/exp-inl.h, ref's exp_portable lane by lane), den = sum_j e_j (j
// ascending), acc = sum_j (e_j / den) * k_j (j ascending, a Div, a Mul, an Add: never fused), then
// f32(acc). The channels past the last full vector run ref's scalar pool_channel. hf_bf16: ref's
// scalar pool_channel for every channel. OpenMP over pools (independent outputs), so the thread
// count never changes a bit. Non-finite inputs (an input error for the layer) go to ref whole.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/kpool.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "hwy/aligned_allocator.h"
#include "ref/kpool/pool.h"
#include "simd/exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Pools [p0, p1) of k [T, D], z [n, P, D] into out [n, D] (f32 rounding).
void PoolKeysF32(const float* k, const float* z, int64_t p0, int64_t p1, int64_t P, int64_t D, float* out) {
  const hn::ScalableTag<double> d;
  const int64_t N = int64_t(hn::Lanes(d));
  auto zb = hwy::AllocateAligned<double>(size_t(P * N));
  auto kb = hwy::AllocateAligned<double>(size_t(P * N));
  auto eb = hwy::AllocateAligned<double>(size_t(P * N));
  auto ob = hwy::AllocateAligned<double>(size_t(N));
  for (int64_t p = p0; p < p1; ++p) {
    const float* zp = z + p * P * D;  // z[p, j, c] = zp[j * D + c]
    const float* kp = k + p * P * D;  // k[pP + j, c] = kp[j * D + c]
    int64_t c = 0;
    for (; c + N <= D; c += N) {
      for (int64_t j = 0; j < P; ++j)
        for (int64_t i = 0; i < N; ++i) {
          zb[size_t(j * N + i)] = double(zp[j * D + c + i]);
          kb[size_t(j * N + i)] = double(kp[j * D + c + i]);
        }
      auto m = hn::Load(d, zb.get());
      for (int64_t j = 1; j < P; ++j) m = hn::Max(m, hn::Load(d, zb.get() + j * N));
      auto den = hn::Zero(d);
      for (int64_t j = 0; j < P; ++j) {
        const auto e = ExpPortable(d, hn::Sub(hn::Load(d, zb.get() + j * N), m));
        hn::Store(e, d, eb.get() + j * N);
        den = hn::Add(den, e);
      }
      auto acc = hn::Zero(d);
      for (int64_t j = 0; j < P; ++j)
        acc = hn::Add(acc, hn::Mul(hn::Div(hn::Load(d, eb.get() + j * N), den), hn::Load(d, kb.get() + j * N)));
      hn::Store(acc, d, ob.get());
      for (int64_t i = 0; i < N; ++i) out[p * D + c + i] = float(ob[size_t(i)]);
    }
    for (; c < D; ++c) out[p * D + c] = ref::kpool::pool_channel(zp + c, kp + c, P, D, ref::kpool::PoolRounding::f32);
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ref/error.h"
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(PoolKeysF32);

Tensor<float> kpool_pool_keys(const Tensor<float>& k, const Tensor<float>& z, ref::kpool::PoolRounding rounding) {
  bool finite = true;
  for (int64_t i = 0; i < k.numel(); ++i) finite = finite && std::isfinite(k[i]);
  for (int64_t i = 0; i < z.numel(); ++i) finite = finite && std::isfinite(z[i]);
  if (!finite || z.rank() != 3 || k.rank() != 2 || z.dim(2) != k.dim(1) || z.dim(1) < 1 ||
      z.dim(0) != k.dim(0) / z.dim(1))
    return ref::kpool::pool_keys(k, z, rounding);  // ref's result, or ref's error
  const int64_t n = z.dim(0), P = z.dim(1), D = k.dim(1);
  Tensor<float> out({n, D});
  const int64_t per = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, P * D));  // pools per task
  const int64_t tasks = (n + per - 1) / per;
#pragma omp parallel for schedule(static) if (tasks >= 2)
  for (int64_t i = 0; i < tasks; ++i) {
    const int64_t p0 = i * per, p1 = std::min(n, p0 + per);
    if (rounding == ref::kpool::PoolRounding::f32) {
      HWY_DYNAMIC_DISPATCH(PoolKeysF32)(k.ptr(), z.ptr(), p0, p1, P, D, out.ptr());
    } else {
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t c = 0; c < D; ++c)
          out.at(p, c) = ref::kpool::pool_channel(&z.at(p, 0, c), &k.at(p * P, c), P, D, rounding);
    }
  }
  return out;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
