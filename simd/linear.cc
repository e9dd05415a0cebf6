// indexshare simd/: linear (y = x W^T) and head_linear (the same per head, weights read in place
// with strides: MLA's absorbed einsums), bit-identical to ref::linear / ref::head_linear
// (ref/module_ops.h).
//
// ref computes y[r, o] = f32(sum over k ascending of double(x[r, k]) * double(w[o, k])). Here the
// register tile of simd/gemm-inl.h runs with x rows in the place of query heads and rows of w
// (output features) in the place of keys: each lane is one (r, o) and performs
// dot = dot + x * w for k ascending with MulAdd. The product of two f32 values is exact in double,
// so the fused add rounds like ref's add, and the order is ref's: the same bits on every target.
// linear: OpenMP splits over panels of output features (independent outputs); x is packed once,
// each panel of w once, by the thread that computes it. head_linear: OpenMP splits over heads; the
// thread packs the head's rows of x, then runs its panels.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/linear.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/gemm-inl.h"

#include <algorithm>

#include "hwy/aligned_allocator.h"
#include "ref/module_ops.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Columns of x and w per chunk: a chunk of a w panel (kInChunk x TileKeys() doubles, 24 KiB on
// AVX3) and of an x tile (8 KiB) stay in L1 while the tile walks it.
constexpr int64_t kInChunk = 128;

// Row tiles (kTileHeads rows each) covering `rows`; doubles of running sums one row tile keeps
// per panel; doubles of x's rows packed into whole row tiles (PackTiles).
HWY_INLINE int64_t RowTiles(int64_t rows) { return (rows + int64_t(kTileHeads) - 1) / int64_t(kTileHeads); }
HWY_INLINE int64_t TileSums() { return int64_t(kTileHeads * kTileVecs * hn::Lanes(DF64())); }
HWY_INLINE size_t PackedRowsSize(int64_t rows, int64_t in) {
  return size_t(std::max<int64_t>(1, RowTiles(rows) * int64_t(kTileHeads) * in));
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// dst[c * dst_stride + r] = double(src[r * ld + c]) for an 8 x 8 block of f32: a transpose in
// 256-bit registers (unpack, shuffle, 128-bit permute), then one exact conversion per column.
HWY_INLINE void Transpose8x8ToF64(const float* HWY_RESTRICT src, int64_t ld, double* HWY_RESTRICT dst,
                                  int64_t dst_stride) {
  __m256 r[8], t[8], u[8];
  for (int64_t i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; i += 2) {  // t[i]: columns 0,1 | 4,5 of rows i, i+1; t[i+1]: 2,3 | 6,7
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) {  // u[h + m]: column m | m + 4 of rows h..h+3
    u[h + 0] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int m = 0; m < 4; ++m) {  // column m: rows 0-3 from u[m], rows 4-7 from u[4 + m]
    _mm512_storeu_pd(dst + m * dst_stride, _mm512_cvtps_pd(_mm256_permute2f128_ps(u[m], u[4 + m], 0x20)));
    _mm512_storeu_pd(dst + (m + 4) * dst_stride, _mm512_cvtps_pd(_mm256_permute2f128_ps(u[m], u[4 + m], 0x31)));
  }
}
#endif

// One panel of weights in PackPanel's layout: wp[j * nk + i] = double(W(i, j)) for features
// i < count and inputs j < kc, zeros for i in [count, nk), where W(i, j) = w[i * o_stride +
// j * i_stride]. Exact f32 -> f64 conversions, so every path stores the same values: features
// contiguous (o_stride 1, MLA's W_uk) convert a vector at a time; rows contiguous (i_stride 1,
// torch's layout) transpose 8 x 8 blocks on AVX3; the rest goes element by element.
HWY_INLINE void PackWeights(const float* w, int64_t o_stride, int64_t i_stride, int64_t count, int64_t kc,
                            double* HWY_RESTRICT wp) {
  const DF64 d;
  const hn::Rebind<float, DF64> df32;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t nk = int64_t(TileKeys());
  int64_t j0 = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (i_stride == 1 && count == nk && nk % 8 == 0) {
    for (; j0 + 8 <= kc; j0 += 8)
      for (int64_t g = 0; g < nk; g += 8) Transpose8x8ToF64(w + g * o_stride + j0, o_stride, wp + j0 * nk + g, nk);
  }
#endif
  for (int64_t j = j0; j < kc; ++j) {
    const float* col = w + j * i_stride;
    double* HWY_RESTRICT dst = wp + j * nk;
    int64_t i = 0;
    if (o_stride == 1)
      for (; i + N <= count; i += N) hn::Store(hn::PromoteTo(d, hn::LoadU(df32, col + i)), d, dst + i);
    for (; i < count; ++i) dst[i] = double(col[i * o_stride]);
    for (; i < nk; ++i) dst[i] = 0.0;
  }
}

// Output panel pi (features [pi * TileKeys(), ...)) of y for every row: weight (o, k) at
// w[o * o_stride + k * i_stride] (linear: o_stride = in, i_stride = 1), y row r at y + r * y_stride.
// wp and state are the calling thread's scratch. Not inlined into the OpenMP region (see
// AttentionChunk in simd/attention.cc: an outlined region need not carry the target's
// instruction set).
HWY_NOINLINE void LinearPanel(const double* xp, const float* w, int64_t o_stride, int64_t i_stride, int64_t rows,
                              int64_t in, int64_t out, int64_t pi, double* wp, double* state, float* y,
                              int64_t y_stride) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t nk = int64_t(TileKeys());
  const int64_t row_tiles = RowTiles(rows), tile_sums = TileSums();
  const int64_t o0 = pi * nk, count = std::min(nk, out - o0);
  std::fill(state, state + row_tiles * tile_sums, 0.0);
  for (int64_t k0 = 0; k0 < in; k0 += kInChunk) {  // in ascending: ref's order, chunk by chunk
    const int64_t kc = std::min(kInChunk, in - k0);
    PackWeights(w + o0 * o_stride + k0 * i_stride, o_stride, i_stride, count, kc, wp);
    for (int64_t rt = 0; rt < row_tiles; ++rt) {
      double* s = state + rt * tile_sums;
      VF64 acc[kTileHeads][kTileVecs];
      for (size_t h = 0; h < kTileHeads; ++h)
        for (size_t u = 0; u < kTileVecs; ++u) acc[h][u] = hn::Load(d, s + int64_t(h * kTileVecs + u) * N);
      TileDotsAcc(xp + (rt * in + k0) * int64_t(kTileHeads), wp, size_t(kc), acc);
      for (size_t h = 0; h < kTileHeads; ++h)
        for (size_t u = 0; u < kTileVecs; ++u) hn::Store(acc[h][u], d, s + int64_t(h * kTileVecs + u) * N);
    }
  }
  for (int64_t rt = 0; rt < row_tiles; ++rt) {
    const double* s = state + rt * tile_sums;
    for (size_t h = 0; h < kTileHeads; ++h) {
      const int64_t r = rt * int64_t(kTileHeads) + int64_t(h);
      if (r >= rows) break;
      for (int64_t i = 0; i < count; ++i) y[r * y_stride + o0 + i] = float(s[int64_t(h * kTileVecs) * N + i]);
    }
  }
}

void LinearRows(const float* x, const float* w, int64_t rows, int64_t in, int64_t out, float* y) {
  const int64_t nk = int64_t(TileKeys());
  auto xp = hwy::AllocateAligned<double>(PackedRowsSize(rows, in));
  PackTiles(x, rows, in, in, [](float v) { return double(v); }, xp.get());
  const int64_t panels = (out + nk - 1) / nk;
#pragma omp parallel
  {
    // The panel of w, and the running sums of every row tile against it (kept between chunks).
    auto wp = hwy::AllocateAligned<double>(size_t(nk * kInChunk));
    auto state = hwy::AllocateAligned<double>(size_t(RowTiles(rows) * TileSums()));
#pragma omp for schedule(dynamic, 1)
    for (int64_t pi = 0; pi < panels; ++pi)
      LinearPanel(xp.get(), w, in, 1, rows, in, out, pi, wp.get(), state.get(), y, out);
  }
}

// Head h of head_linear: its rows of x (row r at x + (r * heads + h) * in) packed into xp, then
// every panel of its weights (element (o, i) at wh[o * o_stride + i * i_stride]) into
// y + h * out (row stride heads * out).
HWY_NOINLINE void HeadRows(const float* x, int64_t rows, int64_t heads, int64_t in, int64_t out, int64_t h,
                           const float* wh, int64_t o_stride, int64_t i_stride, double* xp, double* wp,
                           double* state, float* y) {
  PackTiles(x + h * in, rows, in, heads * in, [](float v) { return double(v); }, xp);
  const int64_t nk = int64_t(TileKeys());
  const int64_t panels = (out + nk - 1) / nk;
  for (int64_t pi = 0; pi < panels; ++pi)
    LinearPanel(xp, wh, o_stride, i_stride, rows, in, out, pi, wp, state, y + h * out, heads * out);
}

void HeadLinearRows(const float* x, int64_t rows, int64_t heads, int64_t in, int64_t out, const float* w,
                    int64_t head_stride, int64_t o_stride, int64_t i_stride, float* y) {
#pragma omp parallel
  {
    // The thread's scratch, allocated with its first head (a thread without heads takes none).
    hwy::AlignedFreeUniquePtr<double[]> xp, wp, state;
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < heads; ++h) {
      if (!xp) {
        xp = hwy::AllocateAligned<double>(PackedRowsSize(rows, in));
        wp = hwy::AllocateAligned<double>(size_t(int64_t(TileKeys()) * kInChunk));
        state = hwy::AllocateAligned<double>(size_t(RowTiles(rows) * TileSums()));
      }
      HeadRows(x, rows, heads, in, out, h, w + h * head_stride, o_stride, i_stride, xp.get(), wp.get(), state.get(),
               y);
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(LinearRows);
HWY_EXPORT(HeadLinearRows);

ref::IndexerModuleOut indexer_module(const ModelConfig& cfg, const ref::IndexerWeights& w, const Tensor<float>& x,
                                     const Tensor<float>& qr, int64_t start_pos, ref::IndexerVariant v) {
  return ref::indexer_module(cfg, w, x, qr, start_pos, v, simd::linear);
}

ref::Kernels kernels() {
  ref::Kernels k;
  k.linear = simd::linear;
  k.head_linear = simd::head_linear;
  k.logits_fp8 = simd::indexer_logits_fp8;
  k.logits_f32 = simd::indexer_logits_f32;
  k.topk = [](const Tensor<float>& logits, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, int64_t topk) {
    return simd::topk(logits, ks, ke, topk);
  };
  k.sparse_attention = [](const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                          float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length,
                          const Tensor<float>* attn_sink) {
    return simd::sparse_attention(q, kv, indices, sm_scale, d_v, topk_length, attn_sink);
  };
  k.dense_attention = [](const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale, int64_t d_v,
                         const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<float>* attn_sink) {
    return simd::dense_attention(q, kv, sm_scale, d_v, ks, ke, attn_sink);
  };
  k.sparse_attention_backward = simd::sparse_attention_backward;
  k.attention_backward_bounds = simd::attention_backward_bounds;
  k.fused_topk_fp8 = [](const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& kk, const Tensor<float>& k_scale,
                        const Tensor<float>& weights, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                        int64_t topk) { return simd::indexer_topk_fp8(q, kk, k_scale, weights, ks, ke, topk); };
  k.emulate_attention_lowp = simd::emulate_attention_lowp;
  k.attention_bounds = simd::attention_bounds;
  k.attention_bounds_sm = simd::attention_bounds_sm;
  k.prepare_bounds_kv = simd::prepare_bounds_kv;
  k.indexer_logits_rule = simd::indexer_logits_rule;
  k.fill_range = simd::fill_range;
  k.fill_range_bf16 = simd::fill_range_bf16;
  k.quantize_rows = simd::quantize_rows;
  k.indexer_loss = simd::indexer_loss;
  k.v4_compress = simd::v4_compress;
  k.kpool_pool_keys = simd::kpool_pool_keys;
  return k;
}

Tensor<float> linear(const Tensor<float>& x, const Tensor<float>& w) {
  ref::check_linear_inputs(x, w);
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor<float> y({rows, out});
  if (rows > 0 && out > 0) HWY_DYNAMIC_DISPATCH(LinearRows)(x.ptr(), w.ptr(), rows, in, out, y.ptr());
  return y;
}

Tensor<float> head_linear(const Tensor<float>& x, const ref::HeadWeights& w) {
  ref::check_head_linear_inputs(x, w);
  const int64_t rows = x.dim(0);
  Tensor<float> y({rows, w.heads, w.out});
  if (rows > 0 && w.heads > 0 && w.out > 0)
    HWY_DYNAMIC_DISPATCH(HeadLinearRows)(x.ptr(), rows, w.heads, w.in, w.out, w.base, w.head_stride, w.o_stride,
                                         w.i_stride, y.ptr());
  return y;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
