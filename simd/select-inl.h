// indexshare simd/: per-row top-k candidate set, fed with scores in ascending column order.
//
// Each score becomes the 64-bit key of simd/common.h (bigger = better under ref's rule: score
// descending, then index ascending). A row keeps at most 2k keys; when full, nth_element keeps
// the k largest and their minimum becomes a threshold: later keys at or below it cannot be in the
// top k (k kept keys are above them) and are dropped. A vector pre-pass skips whole vectors whose
// scores are all below the threshold's score without building keys. Keys are distinct, so the
// final set is exactly the k largest keys whatever the feeding granularity (whole row or key
// blocks), and sorting it descending reproduces ref::topk's order.
//
// NaN: the first NaN column of the row is recorded and the row stops; the caller throws ref's
// error for the first faulty row.

#if defined(INDEXSHARE_SIMD_SELECT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef INDEXSHARE_SIMD_SELECT_INL_H_
#undef INDEXSHARE_SIMD_SELECT_INL_H_
#else
#define INDEXSHARE_SIMD_SELECT_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "hwy/highway.h"
#include "simd/common.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

struct RowTopk {
  uint64_t* buf = nullptr;  // capacity 2 * k
  int64_t k = 0;            // min(topk, window length); 0: nothing to select
  int64_t count = 0;
  uint64_t thr = 0;  // keys <= thr are rejected (0 rejects nothing: every key is > 0)
  float fthr = -std::numeric_limits<float>::infinity();  // thr's score: scores below are rejected
  int64_t nan_col = -1;

  void prune() {
    std::nth_element(buf, buf + (k - 1), buf + count, std::greater<uint64_t>());
    count = k;
    thr = buf[k - 1];  // the smallest kept key
    const uint32_t o = uint32_t(thr >> 32);
    const uint32_t b = (o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o;
    std::memcpy(&fthr, &b, sizeof fthr);
  }

  // Returns false (and records col) on NaN.
  bool push(float x, int64_t local, int64_t col) {
    if (std::isnan(x)) {
      nan_col = col;
      return false;
    }
    const uint64_t key = detail::topk_key(x, local);
    if (key <= thr) return true;
    buf[count++] = key;
    if (count == 2 * k) prune();
    return true;
  }

  // vals[i] is the score of local index local0 + i, column col0 + i.
  void feed(const float* HWY_RESTRICT vals, int64_t n, int64_t local0, int64_t col0) {
    if (k == 0 || nan_col >= 0) return;
    const hn::ScalableTag<float> df;
    const int64_t N = int64_t(hn::Lanes(df));
    int64_t i = 0;
    for (; i + N <= n; i += N) {
      // NaN lanes compare false, so they always reach the scalar path.
      if (hn::AllTrue(df, hn::LoadU(df, vals + i) < hn::Set(df, fthr))) continue;
      for (int64_t l = i; l < i + N; ++l)
        if (!push(vals[l], local0 + l, col0 + l)) return;
    }
    for (; i < n; ++i)
      if (!push(vals[i], local0 + i, col0 + i)) return;
  }

  // out[0, topk) of the row: the selected local indices in ref order, then -1 (already there).
  void finish(int32_t* out) {
    if (k == 0 || nan_col >= 0) return;
    if (count > k) prune();
    std::sort(buf, buf + count, std::greater<uint64_t>());
    for (int64_t j = 0; j < count; ++j) out[j] = detail::topk_key_local(buf[j]);
  }
};

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
