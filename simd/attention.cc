// indexshare simd/: sparse and dense attention with ref/attention.cc's semantics.
//
// Per query row t (OpenMP splits over rows only, so the thread count never changes a bit):
//   rows     the valid kv rows, sorted ascending, duplicates kept (exactly ref's list)
//   pass 1   logits for all heads at once: q[t] (h_q x d_qk) times a panel of TileKeys() gathered
//            kv rows, the register-blocked tile of simd/gemm-inl.h (lanes = kv rows, d ascending,
//            bf16 x bf16 products exact in double, so the fused add rounds like ref's add);
//            P = dot * sm_scale in double
//   pass 2   per head, scalar and in ref's order: max, exp(P - m) with the C library's exp, the
//            running sum, lse, the sink factor
//   pass 3   out = sum_i p_i * V_i over rows ascending, vectorized over d_v: each lane performs
//            acc = acc + p_i * v (a multiply, then an add), ref's sequence for that column
// So each output is produced by the same operations in the same order as ref, and the present code
// is bit-identical to ref. The documented contract is looser (a tolerance derived in
// tests/test_simd.cc) so that a later kernel may reorder the reductions.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/gemm-inl.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "ref/numerics.h"
#include "simd/common.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Vectors of d_v per P.V register tile, and heads per tile (accumulators: heads x vecs registers).
constexpr size_t kPVVecs = 4;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kPVHeads = 4;
#else
constexpr size_t kPVHeads = 2;
#endif
// Rows of V decoded at a time (the tile's V slice, kPVRows x kPVVecs vectors, stays in L1).
constexpr int64_t kPVRows = 64;

// acc[h][c0 .. c0 + kPVVecs * N) += p[h][i] * V[i][same columns] for i ascending, kHeads heads.
template <size_t kHeads>
HWY_INLINE void PVTile(const double* const* HWY_RESTRICT p, const double* HWY_RESTRICT vbuf,
                       int64_t rn, int64_t dvp, int64_t c0, double* const* HWY_RESTRICT acc) {
  const DF64 d;
  const size_t N = hn::Lanes(d);
  VF64 a[kHeads][kPVVecs];
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kPVVecs; ++u) a[h][u] = hn::Load(d, acc[h] + c0 + u * N);
  for (int64_t i = 0; i < rn; ++i) {
    const double* HWY_RESTRICT vrow = vbuf + i * dvp + c0;
    VF64 vv[kPVVecs];
    for (size_t u = 0; u < kPVVecs; ++u) vv[u] = hn::Load(d, vrow + u * N);
    for (size_t h = 0; h < kHeads; ++h) {
      const VF64 pb = hn::Set(d, p[h][i]);
      for (size_t u = 0; u < kPVVecs; ++u) a[h][u] = hn::Add(a[h][u], hn::Mul(pb, vv[u]));
    }
  }
  for (size_t h = 0; h < kHeads; ++h)
    for (size_t u = 0; u < kPVVecs; ++u) hn::Store(a[h][u], d, acc[h] + c0 + u * N);
}

void AttentionRows(const detail::AttentionView& v, float* out, float* lse_out, float* max_out) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const int64_t nk = int64_t(TileKeys());
  const int64_t head_blocks = (h_q + int64_t(kTileHeads) - 1) / int64_t(kTileHeads);
  const int64_t hp = head_blocks * int64_t(kTileHeads);
  const int64_t cw = int64_t(kPVVecs) * N;      // columns per P.V tile
  const int64_t dvp = (d_v + cw - 1) / cw * cw;  // d_v padded to whole tiles
  const auto dec = [](const uint16_t b) { return detail::bf16_to_double(b); };

#pragma omp parallel
  {
    auto qp = hwy::AllocateAligned<double>(size_t(std::max<int64_t>(1, hp * d_qk)));
    auto kpan = hwy::AllocateAligned<double>(size_t(std::max<int64_t>(1, d_qk * nk)));
    auto vbuf = hwy::AllocateAligned<double>(size_t(kPVRows * dvp));
    auto acc = hwy::AllocateAligned<double>(size_t(std::max<int64_t>(1, h_q * dvp)));
    hwy::AlignedFreeUniquePtr<double[]> pbuf;
    int64_t pbuf_size = 0;
    std::vector<int64_t> rows;
    std::vector<double> factor(static_cast<size_t>(h_q));

#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < v.s_q; ++t) {
      rows.clear();
      if (v.dense) {
        for (int64_t i = v.ks[t]; i < v.ke[t]; ++i) rows.push_back(i);
      } else {
        const int64_t len = v.topk_length ? v.topk_length[t] : v.topk;
        for (int64_t j = 0; j < len; ++j) {
          const int64_t i = v.indices[t * v.topk + j];
          if (0 <= i && i < v.s_kv) rows.push_back(i);
        }
        std::sort(rows.begin(), rows.end());
      }
      const int64_t n = int64_t(rows.size());
      if (n == 0) {  // lonely query: FlashMLA HEAD convention
        std::fill(out + t * h_q * d_v, out + (t + 1) * h_q * d_v, 0.0f);
        for (int64_t h = 0; h < h_q; ++h) {
          lse_out[t * h_q + h] = std::numeric_limits<float>::infinity();
          max_out[t * h_q + h] = -std::numeric_limits<float>::infinity();
        }
        continue;
      }
      const int64_t n_pad = (n + nk - 1) / nk * nk;
      if (h_q * n_pad > pbuf_size) {
        pbuf_size = h_q * n_pad;
        pbuf = hwy::AllocateAligned<double>(size_t(pbuf_size));
      }
      // Pass 1: P[h][i] = (q[t,h,:] . kv[rows[i]]) * sm_scale.
      PackTiles(v.q + t * h_q * d_qk, h_q, d_qk, dec, qp.get());
      const VF64 scale = hn::Set(d, v.sm_scale);
      for (int64_t i0 = 0; i0 < n; i0 += nk) {
        PackPanel<uint16_t>([&](int64_t i) { return v.kv + rows[size_t(i0 + i)] * d_qk; },
                            std::min(nk, n - i0), d_qk, dec, kpan.get());
        for (int64_t hb = 0; hb < head_blocks; ++hb) {
          VF64 dots[kTileHeads][kTileVecs];
          TileDots(qp.get() + hb * d_qk * int64_t(kTileHeads), kpan.get(), size_t(d_qk), dots);
          const int64_t hcount = std::min<int64_t>(int64_t(kTileHeads), h_q - hb * int64_t(kTileHeads));
          for (int64_t h = 0; h < hcount; ++h)
            for (size_t u = 0; u < kTileVecs; ++u)
              hn::Store(hn::Mul(dots[h][u], scale), d,
                        pbuf.get() + (hb * int64_t(kTileHeads) + h) * n_pad + i0 + int64_t(u) * N);
        }
      }
      // Pass 2: softmax statistics per head, in ref's order.
      for (int64_t h = 0; h < h_q; ++h) {
        double* p = pbuf.get() + h * n_pad;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);
        double l = 0.0;
        for (int64_t i = 0; i < n; ++i) l += (p[i] = std::exp(p[i] - m));
        const double lse = m + std::log(l);
        double f = 1.0 / l;
        if (v.sink) f *= 1.0 / (1.0 + std::exp(double(v.sink[h]) - lse));
        factor[size_t(h)] = f;
        lse_out[t * h_q + h] = float(lse);
        max_out[t * h_q + h] = float(m);
      }
      // Pass 3: acc[h][c] = sum_i p[h][i] * V[rows[i]][c], rows ascending.
      std::fill(acc.get(), acc.get() + h_q * dvp, 0.0);
      for (int64_t r0 = 0; r0 < n; r0 += kPVRows) {
        const int64_t rn = std::min(kPVRows, n - r0);
        for (int64_t i = 0; i < rn; ++i) {
          const uint16_t* src = v.kv + rows[size_t(r0 + i)] * d_qk;
          double* dst = vbuf.get() + i * dvp;
          for (int64_t c = 0; c < d_v; ++c) dst[c] = dec(src[c]);
          for (int64_t c = d_v; c < dvp; ++c) dst[c] = 0.0;
        }
        for (int64_t c0 = 0; c0 < dvp; c0 += cw) {
          int64_t h = 0;
          for (; h + int64_t(kPVHeads) <= h_q; h += int64_t(kPVHeads)) {
            const double* ps[kPVHeads];
            double* as[kPVHeads];
            for (size_t e = 0; e < kPVHeads; ++e) {
              ps[e] = pbuf.get() + (h + int64_t(e)) * n_pad + r0;
              as[e] = acc.get() + (h + int64_t(e)) * dvp;
            }
            PVTile<kPVHeads>(ps, vbuf.get(), rn, dvp, c0, as);
          }
          for (; h < h_q; ++h) {
            const double* ps[1] = {pbuf.get() + h * n_pad + r0};
            double* as[1] = {acc.get() + h * dvp};
            PVTile<1>(ps, vbuf.get(), rn, dvp, c0, as);
          }
        }
      }
      for (int64_t h = 0; h < h_q; ++h) {
        float* o = out + (t * h_q + h) * d_v;
        const double* a = acc.get() + h * dvp;
        for (int64_t c = 0; c < d_v; ++c) o[c] = float(a[c] * factor[size_t(h)]);
      }
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(AttentionRows);

namespace {

detail::AttentionView make_view(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                                int64_t d_v, const Tensor<float>* attn_sink) {
  static_assert(sizeof(bf16_t) == sizeof(uint16_t));
  detail::AttentionView v;
  v.q = reinterpret_cast<const uint16_t*>(q.ptr());
  v.kv = reinterpret_cast<const uint16_t*>(kv.ptr());
  v.s_q = q.dim(0);
  v.h_q = q.dim(1);
  v.d_qk = q.dim(2);
  v.s_kv = kv.dim(0);
  v.d_v = d_v;
  v.sm_scale = double(sm_scale);
  v.sink = attn_sink ? attn_sink->ptr() : nullptr;
  return v;
}

AttentionOut run(const detail::AttentionView& v) {
  AttentionOut o{Tensor<float>({v.s_q, v.h_q, v.d_v}), Tensor<bf16_t>({v.s_q, v.h_q, v.d_v}),
                 Tensor<float>({v.s_q, v.h_q}), Tensor<float>({v.s_q, v.h_q})};
  HWY_DYNAMIC_DISPATCH(AttentionRows)(v, o.out.ptr(), o.lse.ptr(), o.max_logits.ptr());
  for (int64_t i = 0; i < o.out.numel(); ++i) o.out_bf16[i] = f32_to_bf16(o.out[i]);
  return o;
}

}  // namespace

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0);
  require(indices.rank() == 3 && indices.dim(0) == s_q && indices.dim(1) == 1,
          "attention indices: expected [s_q=" + std::to_string(s_q) + ", 1, topk], got " +
              shape_str(indices.shape));
  const int64_t topk = indices.dim(2);
  if (topk_length) {
    require_shape(*topk_length, {s_q}, "attention topk_length");
    for (int64_t t = 0; t < s_q; ++t)
      require(0 <= (*topk_length)[t] && (*topk_length)[t] <= topk,
              "attention topk_length: row " + std::to_string(t) + " has " +
                  std::to_string((*topk_length)[t]) + ", outside [0, topk=" + std::to_string(topk) + "]");
  }
  detail::AttentionView v = make_view(q, kv, sm_scale, d_v, attn_sink);
  v.indices = indices.ptr();
  v.topk = topk;
  v.topk_length = topk_length ? topk_length->ptr() : nullptr;
  return run(v);
}

AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), s_kv = kv.dim(0);
  require_shape(ks, {s_q}, "attention ks");
  require_shape(ke, {s_q}, "attention ke");
  for (int64_t t = 0; t < s_q; ++t)
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "attention ks/ke: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
  detail::AttentionView v = make_view(q, kv, sm_scale, d_v, attn_sink);
  v.dense = true;
  v.ks = ks.ptr();
  v.ke = ke.ptr();
  return run(v);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
