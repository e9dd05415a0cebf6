// indexshare simd/: the indexer's distillation loss and its gradients (ref/train/indexer_loss.h),
// bit-identical to ref.
//
// The rows are independent (I, the target, log q, kl, dI, dw' and dq of row t read only row t's
// inputs): OpenMP over rows runs ref's row step (detail::loss_row), so every row performs ref's
// operations in ref's order. dk[s, :] sums over every query row and head, t ascending then h: it
// is split over blocks of key rows (each dk row is written by one thread, never atomics), and
// within a block each term dS * q[t,h,:] is added across the D columns in vector lanes, a
// multiply then an add per lane (never fused), the same two roundings per element as ref's
// scalar loop, in the same (t, h) order per element. 1[S > 0] comes from ref's head_score (the
// same dot product, d ascending). The kl sum over rows and the loss are ref's finish.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/indexer_loss.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ref/train/indexer_loss.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// acc[d] = acc[d] + s * x[d] for d < n: a multiply then an add per lane, as ref's scalar loop.
void AddScaled(double* acc, double s, const double* x, int64_t n) {
  const hn::ScalableTag<double> d;
  const int64_t N = int64_t(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, acc + i), hn::Mul(vs, hn::LoadU(d, x + i))), d, acc + i);
  for (; i < n; ++i) acc[i] = acc[i] + s * x[i];
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(AddScaled);

namespace {

// ref::train::detail::dk_keys with the per-term update in lanes (AddScaled), same order.
void dk_block(const ref::train::detail::LossContext& c, int64_t s_begin, int64_t s_end,
              ref::train::IndexerLossOut& out) {
  const int64_t H = c.H, D = c.D;
  std::vector<double> acc(static_cast<size_t>((s_end - s_begin) * D), 0.0);
  for (int64_t t = 0; t < c.s_q; ++t) {
    const std::vector<int64_t>& R = c.rows[size_t(t)];
    for (auto it = std::lower_bound(R.begin(), R.end(), s_begin); it != R.end() && *it < s_end; ++it) {
      const int64_t s = *it;
      const double dI = c.dI[size_t(t * c.s_kv + s)];
      double* a = &acc[size_t((s - s_begin) * D)];
      for (int64_t h = 0; h < H; ++h) {
        if (c.o.relu && !(ref::train::detail::head_score(c, t, h, s) > 0.0)) continue;
        const double dS = dI * c.w[size_t(t * H + h)];
        HWY_DYNAMIC_DISPATCH(AddScaled)(a, dS, &c.q[size_t((t * H + h) * D)], D);
      }
    }
  }
  for (int64_t s = s_begin; s < s_end; ++s)
    for (int64_t d = 0; d < D; ++d) out.dk.at(s, d) = float(acc[size_t((s - s_begin) * D + d)]);
}

ref::train::IndexerLossOut run(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                               const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<int32_t>* topk,
                               const std::vector<ref::train::TeacherLayer>& teachers,
                               const ref::train::IndexerLossOptions& o) {
  ref::train::IndexerLossOut out;
  ref::train::detail::LossContext c = ref::train::detail::prepare(q, k, w, ks, ke, topk, teachers, o, out);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < c.s_q; ++t) ref::train::detail::loss_row(c, t, out);
  constexpr int64_t kKeyBlock = 16;
  const int64_t blocks = (c.s_kv + kKeyBlock - 1) / kKeyBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) dk_block(c, b * kKeyBlock, std::min(c.s_kv, (b + 1) * kKeyBlock), out);
  ref::train::detail::finish(c, out);
  return out;
}

}  // namespace

ref::train::IndexerLossOut indexer_loss(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                                        const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                        const Tensor<int32_t>* topk,
                                        const std::vector<ref::train::TeacherLayer>& teachers,
                                        const ref::train::IndexerLossOptions& o) {
  return run(q, k, w, ks, ke, topk, teachers, o);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
