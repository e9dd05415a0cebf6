// indexshare simd/: sparse and dense attention with ref/attention.cc's semantics, operation for
// operation, so the outputs equal ref's bit for bit on every target.
//
// Per query row t (OpenMP splits over chunks of rows only, so the thread count never changes a bit):
//   rows     the valid kv rows, sorted ascending, duplicates kept (exactly ref's list; a radix
//            sort for long lists)
//   pass 1   P[h][i] = (q[t,h,:] . k_i) * sm_scale with lanes over d: the accumulator lanes of
//            one dot are ref's 8 parts (lane l of accumulator a holds part a * N + l, N lanes per
//            vector, 8 / N accumulators), each part summing d ascending with MulAdd (bf16 x bf16
//            products are exact in double, so fused or not rounds like ref's add); the parts are
//            then folded in ref's tree (on AVX3 eight dots at once). A tile of kDotHeads heads x
//            kDotKeys keys is computed at once from q (decoded once per row) and a block of
//            gathered, decoded kv rows. P is kept key-major: P[i][h], the heads of a key side by side.
//   pass 2   lanes over heads, each lane performing ref's loop for its head: the maximum (from
//            -inf, i ascending, as std::max), exp_portable (simd/exp-inl.h) and the sum l
//            (i ascending); then lse = m + log(l) and the sink factor per head
//   pass 3   out = sum_i p_i * V_i, lanes over d_v columns, i ascending, one fused multiply-add
//            per term as ref's std::fma (targets without FMA instructions call std::fma per lane);
//            V is gathered and decoded a slice of columns x a sub-chunk of rows at a time into L1,
//            where every head tile reads it
//   output   out = f32(acc * factor) and its bf16 (ref's f32_to_bf16 lane by lane), per row
// The tiles, the decode, the sort and the softmax statistics are in simd/attention-inl.h (shared
// with the backward, simd/attention_bwd.cc); this file holds the row driver and the output.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/exp-inl.h"
#include "simd/attention-inl.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "ref/numerics.h"
#include "simd/common.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kv rows are prefetched this many rows ahead of the row being decoded (about one key block of
// pass 1's work, several hundred cycles per row).
constexpr int64_t kPrefetchRows = int64_t(kDotKeys);

// Prefetches the first `bytes` of kv row `row` (a row of the next block, while the present one is
// decoded or computed: gathered rows defeat the hardware prefetcher).
HWY_INLINE void PrefetchRow(const uint16_t* kv, int64_t d_qk, int64_t row, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(kv + row * d_qk);
  for (int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(p + b);
}

// Rows rows[from, to) of kv, their first `cols` columns, decoded into the key-block layout with
// `pad_cols` columns (zeros past `cols`), list position i at KeyBlockAt(base, pad_cols, i - from);
// the rows kPrefetchRows ahead are prefetched as each row is decoded.
HWY_INLINE void DecodeRows(const uint16_t* kv, int64_t d_qk, const std::vector<int64_t>& rows,
                           int64_t from, int64_t to, int64_t cols, int64_t pad_cols, double* base) {
  const int64_t n = int64_t(rows.size());
  for (int64_t i = from; i < to; ++i) {
    if (i + kPrefetchRows < n) PrefetchRow(kv, d_qk, rows[size_t(i + kPrefetchRows)], cols * 2);
    DecodeBf16Blocks(kv + rows[size_t(i)] * d_qk, cols, pad_cols, int64_t(kDotKeys * kParts),
                     KeyBlockAt(base, pad_cols, i - from));
  }
}

// dst[i] = f32_to_bf16(src[i]).bits for i < n: ref's rounding (to nearest, ties to even, on the
// bits; NaN -> quiet NaN with the sign kept), lane by lane on 32-bit integers.
HWY_INLINE void F32ToBf16(const float* HWY_RESTRICT src, uint16_t* HWY_RESTRICT dst, int64_t n) {
  const hn::ScalableTag<int32_t> di;
  const hn::RebindToUnsigned<decltype(di)> du;
  const hn::Rebind<uint16_t, decltype(di)> d16;
  const int64_t N = int64_t(hn::Lanes(di));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto u = hn::LoadU(di, reinterpret_cast<const int32_t*>(src + i));
    const auto hi = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, u)));  // u >> 16, logical
    const auto is_nan = hn::Gt(hn::And(u, hn::Set(di, 0x7FFFFFFF)), hn::Set(di, 0x7F800000));
    const auto lsb = hn::And(hi, hn::Set(di, 1));
    const auto rounded = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, hn::Add(hn::Add(u, hn::Set(di, 0x7FFF)), lsb))));
    const auto nan = hn::Or(hn::And(hi, hn::Set(di, 0x8000)), hn::Set(di, 0x7FC0));
    hn::StoreU(hn::DemoteTo(d16, hn::IfThenElse(is_nan, nan, rounded)), d16, dst + i);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]).bits;
}

// y[i] = exp_portable(x[i]) (the export behind simd::exp_portable, for the tests).
void ExpArray(const double* x, double* y, int64_t n) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ExpPortable(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {  // the tail through a padded vector, so that every value takes the vector path
    HWY_ALIGN double buf[kParts] = {};
    std::copy(x + i, x + n, buf);
    hn::Store(ExpPortable(d, hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (n - i), y + i);
  }
}

// The kv rows query row t attends: its window [ks, ke) (dense), or its valid indices (topk_length
// slots; -1 and out-of-range ones skipped) sorted ascending, duplicates kept (sparse).
HWY_INLINE void AttentionRows(const detail::AttentionView& v, int64_t t, std::vector<int64_t>& rows,
                              std::vector<int64_t>& sort_tmp) {
  rows.clear();
  if (v.dense) {
    for (int64_t i = v.ks[t]; i < v.ke[t]; ++i) rows.push_back(i);
  } else {
    const int64_t len = v.topk_length ? v.topk_length[t] : v.topk;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = v.indices[t * v.topk + j];
      if (0 <= i && i < v.s_kv) rows.push_back(i);
    }
    SortRows(rows, v.s_kv, sort_tmp);
  }
}

// Pass 2 of query row t: the softmax statistics (SoftmaxStats: max and sum per head, lanes over
// heads, two vectors at a time; P [n keys][hs] becomes exp(p - m)), then per head lse, max_logits
// and the output's factor 1 / l (times the sink's 1 / (1 + exp(sink - lse))). mx, l: scratch of hs
// doubles.
HWY_INLINE void AttentionSoftmax(const detail::AttentionView& v, int64_t t, double* P, int64_t hs, int64_t n,
                                 double* mx, double* l, double* factor, float* lse_out, float* max_out) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q;
  {
    int64_t h0 = 0;
    for (; h0 + 2 * N <= hs; h0 += 2 * N) SoftmaxStats<2>(P + h0, hs, n, mx + h0, l + h0);
    for (; h0 < hs; h0 += N) SoftmaxStats<1>(P + h0, hs, n, mx + h0, l + h0);
  }
  for (int64_t h = 0; h < h_q; ++h) {
    const double lse = mx[h] + std::log(l[h]);
    double f = 1.0 / l[h];
    if (v.sink) f *= 1.0 / (1.0 + indexshare::exp_portable(double(v.sink[h]) - lse));
    factor[size_t(h)] = f;
    lse_out[t * h_q + h] = float(lse);
    max_out[t * h_q + h] = float(mx[h]);
  }
}

// Query row t without keys (a lonely query, FlashMLA HEAD convention): out 0, lse +inf, max_logits
// -inf.
HWY_INLINE void StoreEmptyRow(const detail::AttentionView& v, int64_t t, float* out, uint16_t* out_bf16, float* lse_out,
                              float* max_out) {
  const int64_t h_q = v.h_q, d_v = v.d_v;
  std::fill(out + t * h_q * d_v, out + (t + 1) * h_q * d_v, 0.0f);
  std::fill(out_bf16 + t * h_q * d_v, out_bf16 + (t + 1) * h_q * d_v, uint16_t{0});
  for (int64_t h = 0; h < h_q; ++h) {
    lse_out[t * h_q + h] = std::numeric_limits<float>::infinity();
    max_out[t * h_q + h] = -std::numeric_limits<float>::infinity();
  }
}

// The outputs of query row t from acc [h_q][dvp]: out = f32(acc * factor) (one rounding, as ref),
// and its bf16.
HWY_INLINE void StoreAttentionRow(const detail::AttentionView& v, int64_t t, const double* acc, int64_t dvp,
                                  const double* factor, float* out, uint16_t* out_bf16) {
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q, d_v = v.d_v;
  for (int64_t h = 0; h < h_q; ++h) {
    float* o = out + (t * h_q + h) * d_v;
    uint16_t* ob = out_bf16 + (t * h_q + h) * d_v;
    const double* a = acc + h * dvp;
    const hn::Rebind<float, DF64> df32;
    const VF64 fv = hn::Set(d, factor[size_t(h)]);
    int64_t c = 0;
    for (; c + N <= d_v; c += N) hn::StoreU(hn::DemoteTo(df32, hn::Mul(hn::Load(d, a + c), fv)), df32, o + c);
    for (; c < d_v; ++c) o[c] = float(a[c] * factor[size_t(h)]);
    F32ToBf16(o, ob, d_v);
  }
}

// Query rows [t0, t1), all heads, with this call's own scratch. No OpenMP in here: the caller
// (the HWY_ONCE part) splits the rows into chunks across threads. An OpenMP region inside a target
// function is outlined by the compiler into a function that need not carry the target's
// instruction set (clang 14 then fails to select SSE4.1 roundpd).
void AttentionChunk(const detail::AttentionView& v, int64_t t0, int64_t t1, float* out, uint16_t* out_bf16,
                    float* lse_out, float* max_out, AttentionPhases* phases) {
  AttentionPhases ph;
  double other = 0;  // row lists, accumulator reset, output: total minus the named phases
  detail::PhaseClock clk;
  clk.on = phases != nullptr;
  clk.start();
  const DF64 d;
  const int64_t N = int64_t(hn::Lanes(d));
  const int64_t h_q = v.h_q, d_qk = v.d_qk, d_v = v.d_v;
  const int64_t kb = int64_t(kDotKeys);
  const int64_t dpad = (d_qk + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);
  const int64_t hpad = (h_q + int64_t(kDotHeads) - 1) / int64_t(kDotHeads) * int64_t(kDotHeads);
  const int64_t q_tile = int64_t(kDotHeads) * dpad;  // doubles per head tile of q
  // P is key-major, hs doubles per key (h_q rounded up to whole 8-lane groups: softmax runs with
  // lanes over heads). Pass 1 never writes the heads past hpad: zero when pbuf is allocated, then
  // whatever finite values softmax leaves there; no output reads them.
  const int64_t hs = (h_q + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);
  const int64_t cw = int64_t(kPVVecs) * N;  // columns per P.V tile
  // d_v padded to whole 8-column groups (every lane count divides 8): the last P.V slice may be
  // narrower than cw (d_v 40 = one slice of 32 + one of 8 on AVX3, no padded FMAs).
  const int64_t dvp = (d_v + int64_t(kParts) - 1) / int64_t(kParts) * int64_t(kParts);

  auto qd = hwy::AllocateAligned<double>(size_t(hpad * dpad));
  auto slice = hwy::AllocateAligned<double>(size_t(PVSubRows(hs, cw) * cw));  // PVFromRows' slice of V
  auto acc = hwy::AllocateAligned<double>(size_t(h_q * dvp));
  auto kbuf = hwy::AllocateAligned<double>(size_t(kb * dpad));  // one key block, pass 1's layout
  hwy::AlignedFreeUniquePtr<double[]> pbuf;
  int64_t pbuf_size = 0;
  std::vector<int64_t> rows, sort_tmp;
  std::vector<const char*> pf_lines(size_t(kb * ((d_qk * 2 + 63) / 64)));  // next block's kv lines
  std::vector<double> factor(static_cast<size_t>(h_q));
  auto l = hwy::AllocateAligned<double>(size_t(hs)), mx = hwy::AllocateAligned<double>(size_t(hs));
  std::fill(qd.get(), qd.get() + hpad * dpad, 0.0);  // padding heads stay zero

  for (int64_t t = t0; t < t1; ++t) {
    AttentionRows(v, t, rows, sort_tmp);
    const int64_t n = int64_t(rows.size());
    if (n == 0) {  // lonely query: FlashMLA HEAD convention
      StoreEmptyRow(v, t, out, out_bf16, lse_out, max_out);
      continue;
    }
    const int64_t n_pad = (n + kb - 1) / kb * kb;
    if (hs * n_pad > pbuf_size) {
      pbuf_size = hs * n_pad;
      pbuf = hwy::AllocateAligned<double>(size_t(pbuf_size));
      std::fill(pbuf.get(), pbuf.get() + pbuf_size, 0.0);
    }
    clk.lap(&other);
    // Pass 1: P[h][i] = (q[t,h,:] . kv[rows[i]]) * sm_scale. q is decoded once per row into
    // head tiles, kv rows a key block at a time, both interleaved (see DotTile).
    for (int64_t h = 0; h < h_q; ++h)
      DecodeBf16Blocks(v.q + (t * h_q + h) * d_qk, d_qk, dpad, int64_t(kDotHeads * kParts),
                       qd.get() + (h / int64_t(kDotHeads)) * q_tile + (h % int64_t(kDotHeads)) * int64_t(kParts));
    clk.lap(&ph.q_decode);
    for (int64_t i = 0; i < std::min(n, kPrefetchRows); ++i) PrefetchRow(v.kv, d_qk, rows[size_t(i)], d_qk * 2);
    // The next query row's q is fetched into L2 a few lines per key block, so that its decode
    // does not wait on memory.
    const char* q_next = t + 1 < t1 ? reinterpret_cast<const char*>(v.q + (t + 1) * h_q * d_qk) : nullptr;
    const int64_t q_bytes = h_q * d_qk * 2;
    const int64_t q_step = ((q_bytes + 63) / 64 + n_pad / kb - 1) / (n_pad / kb) * 64;  // bytes per block
    for (int64_t i0 = 0; i0 < n; i0 += kb) {
      const int64_t bn = std::min(kb, n - i0);
      double* blk = kbuf.get();
      if (q_next)
        for (int64_t b = (i0 / kb) * q_step; b < std::min(q_bytes, (i0 / kb + 1) * q_step); b += 64)
          PrefetchL2(q_next + b);
      // Whole blocks decode inside the first head tile, except when profiling (the phases then
      // time the decode and the tiles apart, on the same operations). The head tiles run in
      // alternating order from block to block (the last tile's q is still in L1 for the next
      // block's first), and the lines of the next block's rows are prefetched spread over the
      // tiles that do not decode (over the one tile when there is one).
      if (kDecodeInTile && !clk.on && bn == kb && d_qk % int64_t(kParts) == 0) {
        const uint16_t* src[kDotKeys];
        for (int64_t k = 0; k < kb; ++k) src[k] = v.kv + rows[size_t(i0 + k)] * d_qk;
        int64_t n_pf = 0;
        for (int64_t k = i0 + kb; k < std::min(n, i0 + 2 * kb); ++k)
          for (int64_t b = 0; b < d_qk * 2; b += 64)
            pf_lines[size_t(n_pf++)] = reinterpret_cast<const char*>(v.kv + rows[size_t(k)] * d_qk) + b;
        const int64_t tiles = hpad / int64_t(kDotHeads);
        const bool reverse = (i0 / kb) % 2 == 1;
        for (int64_t j = 0; j < tiles; ++j) {
          const int64_t h0 = (reverse ? tiles - 1 - j : j) * int64_t(kDotHeads);
          const double* qh = qd.get() + (h0 / int64_t(kDotHeads)) * q_tile;
          double* o = pbuf.get() + i0 * hs + h0;
          if (j == 0) {
            DotTile<true>(qh, blk, dpad, v.sm_scale, o, hs, src, pf_lines.data(), tiles == 1 ? n_pf : 0);
          } else {
            const int64_t l0 = (j - 1) * n_pf / (tiles - 1), l1 = j * n_pf / (tiles - 1);
            DotTile(qh, blk, dpad, v.sm_scale, o, hs, nullptr, pf_lines.data() + l0, l1 - l0);
          }
        }
        continue;
      }
      DecodeRows(v.kv, d_qk, rows, i0, i0 + bn, d_qk, dpad, blk);
      for (int64_t i = bn; i < kb; ++i)  // padding keys of the last block: zeros
        DecodeBf16Blocks(nullptr, 0, dpad, kb * int64_t(kParts), KeyBlockAt(blk, dpad, i));
      clk.lap(&ph.k_gather);
      for (int64_t h0 = 0; h0 < hpad; h0 += int64_t(kDotHeads))
        DotTile(qd.get() + (h0 / int64_t(kDotHeads)) * q_tile, blk, dpad, v.sm_scale,
                pbuf.get() + i0 * hs + h0, hs);
      clk.lap(&ph.qk_tiles);
    }
    // Pass 2: softmax statistics, lanes over heads (SoftmaxStats), two vectors of heads at a time.
    AttentionSoftmax(v, t, pbuf.get(), hs, n, mx.get(), l.get(), factor.data(), lse_out, max_out);
    clk.lap(&ph.softmax);
    // Pass 3: acc[h][c] = sum_i p[h][i] * V[rows[i]][c], rows ascending, fused; the rows are
    // gathered and decoded again (in L1-sized slices).
    std::fill(acc.get(), acc.get() + h_q * dvp, 0.0);
    clk.lap(&other);
    PVFromRows(pbuf.get(), hs, h_q, v.kv, d_qk, d_v, rows.data(), n, dvp, slice.get(), acc.get(), clk, ph);
    StoreAttentionRow(v, t, acc.get(), dvp, factor.data(), out, out_bf16);
  }
  clk.lap(&other);
  if (phases) {
    ph.total = ph.qk_tiles + ph.pv_tiles + ph.k_gather + ph.v_gather + ph.q_decode + ph.softmax + other;
    *phases = ph;
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(AttentionChunk);
HWY_EXPORT(ExpArray);

void exp_portable(const double* x, double* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ExpArray)(x, y, n); }

AttentionPhases& AttentionPhases::operator+=(const AttentionPhases& o) {
  qk_tiles += o.qk_tiles, pv_tiles += o.pv_tiles, k_gather += o.k_gather, v_gather += o.v_gather;
  q_decode += o.q_decode, softmax += o.softmax, total += o.total;
  return *this;
}

namespace {

AttentionOut run(const detail::AttentionView& v, AttentionPhases* phases) {
  AttentionOut o{Tensor<float>({v.s_q, v.h_q, v.d_v}), Tensor<bf16_t>({v.s_q, v.h_q, v.d_v}),
                 Tensor<float>({v.s_q, v.h_q}), Tensor<float>({v.s_q, v.h_q})};
  // Chunks of up to 8 query rows over the threads (independent outputs, so neither the thread
  // count nor the chunk size changes a bit); each chunk allocates its scratch once. Small s_q gets
  // smaller chunks so that every thread has some.
  const int64_t kChunkRows = detail::chunk_rows(v.s_q, 8, omp_get_max_threads());
  const int64_t chunks = (v.s_q + kChunkRows - 1) / kChunkRows;
  std::vector<AttentionPhases> chunk_phases(phases ? size_t(chunks) : 0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c)
    HWY_DYNAMIC_DISPATCH(AttentionChunk)(v, c * kChunkRows, std::min(v.s_q, (c + 1) * kChunkRows), o.out.ptr(),
                                         reinterpret_cast<uint16_t*>(o.out_bf16.ptr()), o.lse.ptr(),
                                         o.max_logits.ptr(), phases ? &chunk_phases[size_t(c)] : nullptr);
  if (phases) {
    *phases = AttentionPhases{};
    for (const AttentionPhases& cp : chunk_phases) *phases += cp;
  }
  return o;
}

}  // namespace

AttentionOut sparse_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
                              const Tensor<int32_t>& indices, float sm_scale, int64_t d_v,
                              const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink,
                              AttentionPhases* phases) {
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
  return run(detail::sparse_view(q, kv, indices, sm_scale, d_v, topk_length, attn_sink), phases);
}

AttentionOut dense_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                             int64_t d_v, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<float>* attn_sink, AttentionPhases* phases) {
  ref::check_attention_inputs(q, kv, d_v, attn_sink);
  const int64_t s_q = q.dim(0), s_kv = kv.dim(0);
  require_shape(ks, {s_q}, "attention ks");
  require_shape(ke, {s_q}, "attention ke");
  for (int64_t t = 0; t < s_q; ++t)
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "attention ks/ke: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
  detail::AttentionView v = detail::attention_view(q, kv, sm_scale, d_v, attn_sink);
  v.dense = true;
  v.ks = ks.ptr();
  v.ke = ke.ptr();
  return run(v, phases);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
