// indexshare simd/: the indexer logits engine, shared by indexer_logits_* and the streaming
// indexer_topk_fp8. It walks the keys in blocks; each block is decoded once into d-major panels
// of TileKeys() keys (simd/gemm-inl.h), then every query row whose window [ks, ke) meets the
// block computes its logits for that part of the window and hands them to an `Emit` sink.
//
// Why the result is ref's bit for bit. For one (t, s), ref does
//   dot_h = sum_d q*k (ascending d, double);  acc = 0;  for h ascending: acc = acc + w_h * relu(dot_h)
//   out = float(acc * double(k_scale[s]))
// Here lanes are keys, so each lane runs that same sequence:
//   - dot_h comes from TileDots, d ascending with MulAdd. FP8: every partial sum is exact anyway
//     (integers below D * 2^36 in units of 2^-18, D <= 2^17 < 2^53 / 2^36), so any order and
//     fusing are exact. f32: the product is exact in double, so the fused add rounds like ref's add,
//     and the order is ref's.
//   - relu keeps NaN and maps everything <= 0 to +0, as ref's (dot > 0 || isnan(dot)) ? dot : 0.
//   - the head sum is a separate Mul then Add per head, heads ascending, starting from +0.
//   - the scale multiply and the f32 rounding are scalar, as in ref.
// Thread count: rows are independent and each (t, s) is computed by the same sequence whichever
// thread runs it, so the OpenMP schedule cannot change a bit.

#if defined(INDEXSHARE_SIMD_INDEXER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef INDEXSHARE_SIMD_INDEXER_INL_H_
#undef INDEXSHARE_SIMD_INDEXER_INL_H_
#else
#define INDEXSHARE_SIMD_INDEXER_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "ref/fp4.h"
#include "simd/common.h"
#include "simd/gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// relu as ref: NaN stays, x <= 0 (including -0) becomes +0.
HWY_INLINE VF64 ReluKeepNaN(VF64 x) { return hn::IfThenZeroElse(x <= hn::Zero(DF64()), x); }

// Logits of one query row for the keys [lo, hi) of the block starting at b0 (lo >= b0), written
// to vals[s - lo]. qp: the row packed by PackTiles; wd: the row's weights as doubles; kpan: the
// block's panels; tmp: TileKeys() aligned doubles of scratch.
HWY_INLINE void RowLogits(const detail::IndexerView& v, int64_t b0, int64_t lo, int64_t hi,
                          const double* HWY_RESTRICT qp, const double* HWY_RESTRICT wd,
                          const double* HWY_RESTRICT kpan, double* HWY_RESTRICT tmp,
                          float* HWY_RESTRICT vals) {
  const DF64 d;
  const size_t N = hn::Lanes(d);
  const int64_t D = v.D, H = v.H, nk = int64_t(TileKeys());
  const int64_t head_blocks = (H + int64_t(kTileHeads) - 1) / int64_t(kTileHeads);
  for (int64_t p = (lo - b0) / nk; p <= (hi - 1 - b0) / nk; ++p) {
    const double* panel = kpan + p * D * nk;
    VF64 acc[kTileVecs];
    for (size_t u = 0; u < kTileVecs; ++u) acc[u] = hn::Zero(d);
    for (int64_t hb = 0; hb < head_blocks; ++hb) {
      VF64 dots[kTileHeads][kTileVecs];
      TileDots(qp + hb * D * int64_t(kTileHeads), panel, size_t(D), dots);
      const int64_t hcount = std::min<int64_t>(int64_t(kTileHeads), H - hb * int64_t(kTileHeads));
      for (int64_t h = 0; h < hcount; ++h) {
        const VF64 w = hn::Set(d, wd[hb * int64_t(kTileHeads) + h]);
        for (size_t u = 0; u < kTileVecs; ++u)
          acc[u] = hn::Add(acc[u], hn::Mul(w, ReluKeepNaN(dots[h][u])));
      }
    }
    for (size_t u = 0; u < kTileVecs; ++u) hn::Store(acc[u], d, tmp + u * N);
    const int64_t pb = b0 + p * nk;
    const int64_t s0 = std::max(lo, pb), s1 = std::min(hi, pb + nk);
    for (int64_t s = s0; s < s1; ++s) {
      const double x = tmp[s - pb] * double(v.k_scale[s]);
      vals[s - lo] = v.bf16_out ? ref::fp4::bf16_of(x) : float(x);
    }
  }
}

// Emit needs: bool active(int64_t t) (false: skip the row from now on) and
// void operator()(int64_t t, int64_t lo, int64_t hi, const float* vals) with vals[s - lo].
// Blocks are visited in ascending key order; within a block, a row is emitted at most once, and
// a row's emits for successive blocks are ordered by the barriers (never concurrent).
template <class Emit>
void RunIndexer(const detail::IndexerView& v, int64_t key_block, Emit& emit) {
  const int64_t H = v.H, D = v.D, s_q = v.s_q, s_kv = v.s_kv;
  const int64_t nk = int64_t(TileKeys());
  const int64_t head_blocks = (H + int64_t(kTileHeads) - 1) / int64_t(kTileHeads);
  const int64_t hp = head_blocks * int64_t(kTileHeads);
  // Block length: key_block, capped so that a block's panels (re-read by every row) stay within
  // kBlockBytes and so in a core's L2 (2 MiB here: 1 MiB blocks ran ~20% faster than 4 MiB ones),
  // capped at s_kv, and rounded up to whole panels. Any block length gives the same bits.
  constexpr int64_t kBlockBytes = int64_t(1) << 20;
  const int64_t l2_keys = std::max<int64_t>(1, kBlockBytes / int64_t(sizeof(double)) / std::max<int64_t>(1, D));
  const int64_t kb = std::clamp<int64_t>(std::min(key_block, l2_keys), 1, std::max<int64_t>(1, s_kv));
  const int64_t block = (kb + nk - 1) / nk * nk;
  const int64_t block_panels = block / nk;
  // Two panel buffers: block b is packed into buffer b % 2 while rows may still read block b - 1
  // from the other one, so one barrier per block suffices.
  const size_t buf_size = size_t(std::max<int64_t>(1, block_panels * D * nk));
  auto kpan = hwy::AllocateAligned<double>(2 * buf_size);
  const double* table = detail::e4m3_table();
  const auto dec8 = [table](const uint8_t c) { return table[c]; };
  const auto dec32 = [](const float x) { return double(x); };

#pragma omp parallel
  {
    auto qp = hwy::AllocateAligned<double>(size_t(std::max<int64_t>(1, hp * D)));
    auto tmp = hwy::AllocateAligned<double>(size_t(nk));
    std::vector<double> wd(size_t(std::max<int64_t>(1, hp)), 0.0);
    std::vector<float> vals(static_cast<size_t>(block));
    for (int64_t b0 = 0; b0 < s_kv; b0 += block) {
      const int64_t b1 = std::min(s_kv, b0 + block);
      const int64_t np = (b1 - b0 + nk - 1) / nk;
      double* panels = kpan.get() + ((b0 / block) % 2) * buf_size;
      // Pass 1: decode the block's keys into panels (each panel by one thread). The barrier at
      // its end also means every row of block b - 2 (the same buffer) is done.
#pragma omp for schedule(static)
      for (int64_t p = 0; p < np; ++p) {
        const int64_t first = b0 + p * nk, count = std::min(nk, b1 - first);
        double* dst = panels + p * D * nk;
        if (v.fp8) {
          const uint8_t* k = static_cast<const uint8_t*>(v.k);
          PackPanel<uint8_t>([&](int64_t i) { return k + (first + i) * D; }, count, D, dec8, dst);
        } else {
          const float* k = static_cast<const float*>(v.k);
          PackPanel<float>([&](int64_t i) { return k + (first + i) * D; }, count, D, dec32, dst);
        }
      }
      // Pass 2: every row whose window meets the block (rows are independent).
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t t = 0; t < s_q; ++t) {
        const int64_t lo = std::max<int64_t>(v.ks[t], b0), hi = std::min<int64_t>(v.ke[t], b1);
        if (lo >= hi || !emit.active(t)) continue;
        if (v.fp8)
          PackTiles(static_cast<const uint8_t*>(v.q) + t * H * D, H, D, D, dec8, qp.get());
        else
          PackTiles(static_cast<const float*>(v.q) + t * H * D, H, D, D, dec32, qp.get());
        for (int64_t h = 0; h < H; ++h) wd[size_t(h)] = double(v.weights[t * H + h]);
        RowLogits(v, b0, lo, hi, qp.get(), wd.data(), panels, tmp.get(), vals.data());
        emit(t, lo, hi, vals.data());
      }
    }
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
