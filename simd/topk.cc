// indexshare simd/: top-k selection (same output and errors as ref/topk.cc) and the streaming fused
// indexer + top-k. Selection: simd/select-inl.h; logits: simd/indexer-inl.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/topk.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/indexer-inl.h"
#include "simd/select-inl.h"

#include <string>
#include <vector>

#include "ref/indexer.h"
#include "simd/common.h"
#include "ref/topk.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {

// Rows whose bounds are bad get bad_bounds[t] = 1 and are skipped; nan_col[t] is the first NaN
// column of row t or -1.
void TopkRows(const float* logits, int64_t s_q, int64_t s_kv, const int32_t* ks,
              const int32_t* ke, int64_t topk, int32_t* out, uint8_t* bad_bounds,
              int64_t* nan_col) {
#pragma omp parallel
  {
    std::vector<uint64_t> buf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < s_q; ++t) {
      if (!(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv)) {
        bad_bounds[t] = 1;
        continue;
      }
      const int64_t n = ke[t] - ks[t];
      RowTopk row;
      row.k = std::min(topk, n);
      buf.resize(size_t(2 * row.k));
      row.buf = buf.data();
      row.feed(logits + t * s_kv + ks[t], n, 0, ks[t]);
      nan_col[t] = row.nan_col;
      row.finish(out + t * topk);
    }
  }
}

// The fused path: one RowTopk per query row, fed block by block.
struct TopkSink {
  RowTopk* rows;
  const int32_t* ks;
  bool active(int64_t t) const { return rows[t].k > 0 && rows[t].nan_col < 0; }
  void operator()(int64_t t, int64_t lo, int64_t hi, const float* vals) const {
    rows[t].feed(vals, hi - lo, lo - ks[t], lo);
  }
};

void IndexerTopk(const detail::IndexerView& v, int64_t topk, int64_t key_block, int32_t* out,
                 int64_t* nan_col) {
  std::vector<RowTopk> rows(static_cast<size_t>(v.s_q));
  std::vector<int64_t> offset(size_t(v.s_q) + 1, 0);
  for (int64_t t = 0; t < v.s_q; ++t) {
    rows[size_t(t)].k = std::min<int64_t>(topk, v.ke[t] - v.ks[t]);
    offset[size_t(t) + 1] = offset[size_t(t)] + 2 * rows[size_t(t)].k;
  }
  std::vector<uint64_t> keys(size_t(std::max<int64_t>(1, offset.back())));
  for (int64_t t = 0; t < v.s_q; ++t) rows[size_t(t)].buf = keys.data() + offset[size_t(t)];
  TopkSink sink{rows.data(), v.ks};
  RunIndexer(v, key_block, sink);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < v.s_q; ++t) {
    nan_col[t] = rows[size_t(t)].nan_col;
    rows[size_t(t)].finish(out + t * topk);
  }
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(TopkRows);
HWY_EXPORT(IndexerTopk);

namespace {

// ref::topk's NaN message.
[[noreturn]] void throw_nan(int64_t t, int64_t s) {
  throw Error("topk logits: NaN at row " + std::to_string(t) + ", column " + std::to_string(s));
}

}  // namespace

Tensor<int32_t> topk(const Tensor<float>& logits, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, int64_t topk) {
  ref::check_topk_inputs(logits, ks, ke, topk);
  const int64_t s_q = logits.dim(0), s_kv = logits.dim(1);
  Tensor<int32_t> out({s_q, topk}, -1);
  std::vector<uint8_t> bad_bounds(size_t(s_q), 0);
  std::vector<int64_t> nan_col(size_t(s_q), -1);
  HWY_DYNAMIC_DISPATCH(TopkRows)(logits.ptr(), s_q, s_kv, ks.ptr(), ke.ptr(), topk, out.ptr(),
                                 bad_bounds.data(), nan_col.data());
  // ref checks row by row: the first row with bad bounds or a NaN decides the error.
  for (int64_t t = 0; t < s_q; ++t) {
    require(!bad_bounds[size_t(t)], "topk ks/ke: row " + std::to_string(t) +
                                        " bounds outside 0 <= ks <= ke <= s_kv");
    if (nan_col[size_t(t)] >= 0) throw_nan(t, nan_col[size_t(t)]);
  }
  return out;
}

Tensor<int32_t> indexer_topk_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, int64_t topk,
                                 int64_t key_block) {
  // ref::topk(ref::indexer_logits_fp8(...)) checks the indexer inputs first, then k.
  ref::check_indexer_inputs(q.shape, k.shape, k_scale, weights, ks, ke);
  require(topk >= 1, "topk: k must be >= 1, got " + std::to_string(topk));
  require(key_block >= 1, "indexer_topk: key_block must be >= 1, got " + std::to_string(key_block));
  detail::IndexerView v;
  v.q = q.ptr();
  v.k = k.ptr();
  v.fp8 = true;
  v.k_scale = k_scale.ptr();
  v.weights = weights.ptr();
  v.ks = ks.ptr();
  v.ke = ke.ptr();
  v.s_q = q.dim(0);
  v.H = q.dim(1);
  v.D = q.dim(2);
  v.s_kv = k.dim(0);
  Tensor<int32_t> out({v.s_q, topk}, -1);
  std::vector<int64_t> nan_col(size_t(v.s_q), -1);
  HWY_DYNAMIC_DISPATCH(IndexerTopk)(v, topk, key_block, out.ptr(), nan_col.data());
  for (int64_t t = 0; t < v.s_q; ++t)
    if (nan_col[size_t(t)] >= 0) throw_nan(t, nan_col[size_t(t)]);
  return out;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
