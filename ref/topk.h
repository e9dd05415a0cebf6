// indexshare: top-k selection per query row, with a deterministic tie rule.
//
//   topk(logits [s_q, s_kv], ks, ke [s_q], topk) -> int32 [s_q, topk]
//
// Row t selects among the key columns s in [ks[t], ke[t]) the k_eff = min(topk, ke[t] - ks[t])
// best ones under the total order
//     a before b  <=>  logits[t, a] > logits[t, b]  or  (logits[t, a] == logits[t, b] and a < b)
// (score descending, then index ascending), and writes them in that order as positions local to
// the row's sequence, s - ks[t]: ks[t] is the first key of the row's sequence in the flattened
// key tensor, as in FlashMLA/vLLM varlen prefill. The trailing topk - k_eff slots hold -1.
// -inf logits inside [ks, ke) are ordinary (lowest) scores and can be selected; -0.0 == +0.0.
// A NaN logit inside [ks, ke) is an input error (message names row and column).
//
// Consumers that want kv rows (FlashMLA's `indices`) add ks[t] back: see local_to_kv_rows.
#pragma once

#include <cstdint>

#include "ref/tensor.h"

namespace indexshare::ref {

// True when (score_a, a) comes before (score_b, b) under the tie rule above.
inline bool topk_before(float score_a, int64_t a, float score_b, int64_t b) {
  return score_a > score_b || (score_a == score_b && a < b);
}

Tensor<int32_t> topk(const Tensor<float>& logits, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, int64_t topk);
// The shape checks topk starts with (rank 2 logits, ks/ke [s_q], k >= 1); simd/ calls it too.
void check_topk_inputs(const Tensor<float>& logits, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                       int64_t topk);

// [s_q, topk] local positions -> [s_q, 1, topk] rows of the flattened kv tensor
// (local + ks[t]; -1 stays -1), the `indices` layout of flash_mla_sparse_fwd.
Tensor<int32_t> local_to_kv_rows(const Tensor<int32_t>& local, const Tensor<int32_t>& ks);

}  // namespace indexshare::ref
