// indexshare simd/: the register-blocked double-precision tile shared by the indexer and the
// attention logits: a [kTileHeads x dim] block of query heads times a [dim x kTileKeys] panel of
// keys, with lanes = keys.
//
// Layouts (doubles, Highway-aligned):
//   q tile   qp[j * kTileHeads + h]          (head block, d-major: one broadcast per head and d)
//   k panel  kp[j * kTileKeys + key]         (key panel, d-major: kTileVecs vector loads per d)
// dots[h][v] lane i = sum over j = 0..dim-1, ASCENDING, of q[h][j] * k[v * N + i][j], one
// MulAdd per j. Each lane therefore performs exactly the scalar loop
//   dot = 0; for j ascending: dot = dot + q * k
// with the product fused into the add. Callers only use it where q * k is exact in double
// (e4m3 x e4m3, f32 x f32, bf16 x bf16: at most 48 significant bits, exponents far from the double
// limits), and then round(q * k + dot) == round(round(q * k) + dot): fused or not (the SSE4/SSSE3
// and SCALAR targets emulate MulAdd with a multiply and an add), the result is the ref's bit for bit.
//
// Per-target shape: AVX-512 has 32 registers, so 8 heads x 3 vectors (24 accumulators, 3 key
// vectors, 1 broadcast q value: per d, 3 loads + 8 broadcast loads feed 24 FMAs); 16-register
// targets use 4 x 3. (4 x 6 and 6 x 4 measured slower than 8 x 3 on AVX3.)

#if defined(INDEXSHARE_SIMD_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef INDEXSHARE_SIMD_GEMM_INL_H_
#undef INDEXSHARE_SIMD_GEMM_INL_H_
#else
#define INDEXSHARE_SIMD_GEMM_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF64 = hn::ScalableTag<double>;
using VF64 = hn::Vec<DF64>;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kTileHeads = 8;
constexpr size_t kTileVecs = 3;
#else
constexpr size_t kTileHeads = 4;
constexpr size_t kTileVecs = 3;
#endif

// Keys per panel (kTileVecs vectors).
HWY_INLINE size_t TileKeys() { return kTileVecs * hn::Lanes(DF64()); }

// dots[h][v] += the tile product described above (continuing the sums already in dots, so a long
// dim can be walked in chunks, d still ascending).
HWY_INLINE void TileDotsAcc(const double* HWY_RESTRICT qp, const double* HWY_RESTRICT kp, size_t dim,
                            VF64 (&dots)[kTileHeads][kTileVecs]) {
  const DF64 d;
  const size_t N = hn::Lanes(d);
  const size_t stride = kTileVecs * N;
  VF64 acc[kTileHeads][kTileVecs];
  for (size_t h = 0; h < kTileHeads; ++h)
    for (size_t v = 0; v < kTileVecs; ++v) acc[h][v] = dots[h][v];
  for (size_t j = 0; j < dim; ++j) {
    VF64 kv[kTileVecs];
    for (size_t v = 0; v < kTileVecs; ++v) kv[v] = hn::Load(d, kp + j * stride + v * N);
    const double* HWY_RESTRICT qrow = qp + j * kTileHeads;
    for (size_t h = 0; h < kTileHeads; ++h) {
      const VF64 qb = hn::Set(d, qrow[h]);
      for (size_t v = 0; v < kTileVecs; ++v) acc[h][v] = hn::MulAdd(qb, kv[v], acc[h][v]);
    }
  }
  for (size_t h = 0; h < kTileHeads; ++h)
    for (size_t v = 0; v < kTileVecs; ++v) dots[h][v] = acc[h][v];
}

// dots[h][v] = the tile product described above.
HWY_INLINE void TileDots(const double* HWY_RESTRICT qp, const double* HWY_RESTRICT kp, size_t dim,
                         VF64 (&dots)[kTileHeads][kTileVecs]) {
  const DF64 d;
  for (size_t h = 0; h < kTileHeads; ++h)
    for (size_t v = 0; v < kTileVecs; ++v) dots[h][v] = hn::Zero(d);
  TileDotsAcc(qp, kp, dim, dots);
}

// Packs rows [0, rows) of dim elements each (row r at src + r * src_stride; src_stride = dim for
// a plain row-major matrix) into head-block tiles dst[hb][j][kTileHeads] (rows padded with zeros
// to a multiple of kTileHeads).
template <typename Elem, class Decode>
HWY_INLINE void PackTiles(const Elem* src, int64_t rows, int64_t dim, int64_t src_stride, Decode decode,
                          double* HWY_RESTRICT dst) {
  const int64_t blocks = (rows + int64_t(kTileHeads) - 1) / int64_t(kTileHeads);
  for (int64_t hb = 0; hb < blocks; ++hb) {
    double* tile = dst + hb * dim * int64_t(kTileHeads);
    for (int64_t h = 0; h < int64_t(kTileHeads); ++h) {
      const int64_t r = hb * int64_t(kTileHeads) + h;
      if (r < rows) {
        const Elem* row = src + r * src_stride;
        for (int64_t j = 0; j < dim; ++j) tile[j * int64_t(kTileHeads) + h] = decode(row[j]);
      } else {
        for (int64_t j = 0; j < dim; ++j) tile[j * int64_t(kTileHeads) + h] = 0.0;
      }
    }
  }
}

// Packs `count` key rows (row(i) gives a pointer to key i's dim elements; count <= TileKeys())
// into one panel dst[j][TileKeys()], padding missing keys with zeros.
template <typename Elem, class RowPtr, class Decode>
HWY_INLINE void PackPanel(RowPtr row, int64_t count, int64_t dim, Decode decode,
                          double* HWY_RESTRICT dst) {
  const int64_t nk = int64_t(TileKeys());
  constexpr int64_t kMaxKeys = int64_t(kTileVecs) * 8;
  const Elem* r[kMaxKeys];
  for (int64_t i = 0; i < count; ++i) r[i] = row(i);
  // j outer: the stores run sequentially through the panel, the loads along `count` rows.
  for (int64_t j = 0; j < dim; ++j) {
    double* HWY_RESTRICT out = dst + j * nk;
    for (int64_t i = 0; i < count; ++i) out[i] = decode(r[i][j]);
    for (int64_t i = count; i < nk; ++i) out[i] = 0.0;
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
