#include "ref/topk.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace indexshare::ref {

void check_topk_inputs(const Tensor<float>& logits, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                       int64_t topk) {
  require(logits.rank() == 2, "topk logits: expected rank 2 [s_q, s_kv], got " + shape_str(logits.shape));
  require(topk >= 1, "topk: k must be >= 1, got " + std::to_string(topk));
  require_shape(ks, {logits.dim(0)}, "topk ks");
  require_shape(ke, {logits.dim(0)}, "topk ke");
}

Tensor<int32_t> topk(const Tensor<float>& logits, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, int64_t topk) {
  check_topk_inputs(logits, ks, ke, topk);
  const int64_t s_q = logits.dim(0), s_kv = logits.dim(1);
  Tensor<int32_t> out({s_q, topk}, -1);
  std::vector<int64_t> cand;
  for (int64_t t = 0; t < s_q; ++t) {
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "topk ks/ke: row " + std::to_string(t) + " bounds outside 0 <= ks <= ke <= s_kv");
    // Pass 1: candidates are the columns of [ks, ke); NaN is refused.
    cand.clear();
    for (int64_t s = ks[t]; s < ke[t]; ++s) {
      if (std::isnan(logits.at(t, s)))
        throw Error("topk logits: NaN at row " + std::to_string(t) + ", column " + std::to_string(s));
      cand.push_back(s);
    }
    // Pass 2: the k_eff best under (score desc, index asc), in that order.
    const int64_t k_eff = std::min<int64_t>(topk, int64_t(cand.size()));
    auto before = [&](int64_t a, int64_t b) { return topk_before(logits.at(t, a), a, logits.at(t, b), b); };
    std::partial_sort(cand.begin(), cand.begin() + k_eff, cand.end(), before);
    for (int64_t j = 0; j < k_eff; ++j) out.at(t, j) = int32_t(cand[size_t(j)] - ks[t]);
  }
  return out;
}

Tensor<int32_t> local_to_kv_rows(const Tensor<int32_t>& local, const Tensor<int32_t>& ks) {
  require(local.rank() == 2, "local_to_kv_rows: expected rank 2 [s_q, topk]");
  const int64_t s_q = local.dim(0), k = local.dim(1);
  require_shape(ks, {s_q}, "local_to_kv_rows ks");
  Tensor<int32_t> rows({s_q, 1, k}, -1);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (local.at(t, j) >= 0) rows[t * k + j] = local.at(t, j) + ks[t];
  return rows;
}

}  // namespace indexshare::ref
