// indexshare: GLM-5.3's pool scores and token selection. The contract is in select.h.
#include "ref/kpool/select.h"

#include <algorithm>
#include <cmath>

#include "ref/error.h"
#include "ref/kpool/pool.h"

namespace indexshare::ref::kpool {

Tensor<int32_t> visible_pools(int64_t s_q, int64_t s_kv, int64_t P) {
  require(s_q >= 1 && s_q <= s_kv, "kpool rows: need 1 <= s_q <= s_kv, got s_q " + std::to_string(s_q) +
                                       ", s_kv " + std::to_string(s_kv));
  const int64_t n = complete_pools(s_kv, P);
  Tensor<int32_t> ke({s_q});
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t pos = s_kv - s_q + t;
    ke[t] = int32_t(std::min((pos + 1) / P, n));
  }
  return ke;
}

Tensor<uint8_t> pool_validity(const Tensor<int32_t>& ke, int64_t n_pools) {
  Tensor<uint8_t> valid({ke.dim(0), n_pools}, 0);
  for (int64_t t = 0; t < ke.dim(0); ++t)
    for (int64_t p = 0; p < n_pools; ++p) valid.at(t, p) = p < ke[t] ? 1 : 0;
  return valid;
}

Tensor<float> pool_scores(const Tensor<float>& q, const Tensor<float>& kbar, const Tensor<float>& weights,
                          int64_t s_kv, int64_t P, const Kernels& kern) {
  require(q.rank() == 3, "kpool q: expected rank 3 [s_q, H, D], got " + shape_str(q.shape));
  const int64_t s_q = q.dim(0), D = q.dim(2), n = complete_pools(s_kv, P);
  require_shape(kbar, {n, D}, "kpool kbar");
  require_shape(weights, {s_q, q.dim(1)}, "kpool weights");
  const Tensor<int32_t> ke = visible_pools(s_q, s_kv, P);
  if (n == 0) return Tensor<float>({s_q, 0});  // no complete pool yet: nothing to score
  const Tensor<int32_t> ks({s_q}, 0);
  const Tensor<float> k_scale({n}, float(1.0 / std::sqrt(double(D))));  // f32(D^-1/2) per pool
  return kern.logits_f32(q, kbar, k_scale, weights, ks, ke);
}

Selection select_tokens(const Tensor<float>& scores, int64_t s_kv, int64_t P, int64_t index_topk, bool tail,
                        const Kernels& kern) {
  require(scores.rank() == 2, "kpool scores: expected rank 2 [s_q, n_pools], got " + shape_str(scores.shape));
  require(P >= 1 && index_topk >= P && index_topk % P == 0,
          "kpool index_topk: must be a positive multiple of the pool size P = " + std::to_string(P) + ", got " +
              std::to_string(index_topk));
  const int64_t s_q = scores.dim(0), n = complete_pools(s_kv, P);
  require_shape(scores, {s_q, n}, "kpool scores");
  const Tensor<int32_t> ke = visible_pools(s_q, s_kv, P);
  Selection sel;
  sel.select_k = std::min(index_topk / P, n);
  const int64_t K = sel.select_k, tail_w = tail ? P - 1 : 0, width = index_topk + tail_w;
  // Pools: score descending, then pool ascending, over each row's visible pools [0, ke[t]).
  sel.pools = K > 0 ? kern.topk(scores, Tensor<int32_t>({s_q}, 0), ke, K) : Tensor<int32_t>({s_q, 0});
  sel.history = Tensor<int32_t>({s_q, K * P}, -1);
  sel.tail = Tensor<int32_t>({s_q, tail_w}, -1);
  sel.indices = Tensor<int32_t>({s_q, width}, -1);
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t pos = s_kv - s_q + t;
    for (int64_t i = 0; i < K; ++i) {  // expansion: slot i -> columns i*P .. i*P + P - 1
      const int32_t p = sel.pools.at(t, i);
      if (p < 0) continue;
      for (int64_t j = 0; j < P; ++j) sel.history.at(t, i * P + j) = int32_t(p * P + j);
    }
    const int64_t tail_count = (pos + 1) % P;  // the query's incomplete pool: pos - tail_count + 1 .. pos
    for (int64_t j = 0; j < tail_w && j < tail_count; ++j) sel.tail.at(t, j) = int32_t(pos - tail_count + 1 + j);
    for (int64_t c = 0; c < K * P; ++c) sel.indices.at(t, c) = sel.history.at(t, c);
    for (int64_t j = 0; j < tail_w; ++j) sel.indices.at(t, K * P + j) = sel.tail.at(t, j);
  }
  return sel;
}

}  // namespace indexshare::ref::kpool
