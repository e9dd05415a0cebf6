// indexshare: GLM-5.3's pool scores and token selection (KPool-DSA, transformers `glm5_next_text`).
//
// Query rows. One sequence of s_kv keys whose last s_q positions are the query rows (a whole
// prefill: s_q = s_kv; a prefill chunk or decode: s_q < s_kv): row t is at position
// pos[t] = s_kv - s_q + t and sees the tokens 0 .. pos[t] (first non-pad token f = 0).
//
// Scores. Pool p (tokens pP .. pP + P - 1, ref/kpool/pool.h) is a candidate for row t only when its
// last token is visible, pP + P - 1 <= pos[t], that is p < ke[t] = floor((pos[t] + 1) / P):
//
//   I[t, p] = sum_h w[t, h] * ReLU(q[t, h] . Kbar[p]) * D^-1/2      p < ke[t]
//   I[t, p] = -inf                                                  otherwise
//
// with w = weights_proj(x) * H^-1/2 in f32 (transformers: `weights_proj(x).float() * n_heads**-0.5`
// and `relu(q . K * softmax_scale)`, softmax_scale = D^-1/2; the ReLU commutes with the positive
// scale). Evaluated exactly as ref::indexer_logits_f32(q, Kbar, k_scale, w, ks, ke) with ks[t] = 0
// and k_scale[p] = f32(D^-1/2) for every pool (the DeepGEMM logits rule of ref/indexer.h: dot
// products and the head sum in double, h ascending, multiply then add, times double(k_scale),
// rounded to f32 once), so simd's indexer gives these bits too. transformers evaluates in f32 and
// fills the masked entries with finfo(f32).min rather than -inf: the same order.
//
// Selection. select_k = min(index_topk / P, n_pools) slots per row (n_pools = floor(s_kv / P), the
// complete pools of the sequence; index_topk % P == 0). Row t takes its min(select_k, ke[t]) best
// pools by ref::topk over [0, ke[t]): score descending, then pool ascending (transformers'
// torch.topk leaves the order of ties unspecified); the other slots hold -1.
//
// Expansion. Each selected pool becomes its P tokens in ascending order: slot i's pool p fills
// columns i*P .. i*P + P - 1 of `history` with pP .. pP + P - 1 (-1 x P for an empty slot).
//
// "Always select the tail" (index_kpool_always_select_tail, the default). The query's incomplete
// pool is appended as raw tokens: tail_count = (pos[t] + 1) mod P, tail = pos[t] - tail_count + 1
// .. pos[t], ascending, in the P - 1 columns of `tail`, -1 padded. When tail_count = 0 the query
// closes its own pool: the tail is empty, that pool is an ordinary candidate, and the query token is
// attended only if its pool wins.
//
// The union index list (the attention's indices, token positions = kv rows of the sequence):
//   indices[t] = history[t] | tail[t] | -1 ...     width index_topk + P - 1 (index_topk without tail)
// history in columns [0, select_k * P), the tail right after (transformers' placement; SGLang puts
// the tail after min(n_visible_pools * P, index_topk) columns: judge the list as a set). P = 1 has
// no tail columns.
//
// Short sequences: when s_kv <= index_topk, select_k = n_pools >= ke[t] for every row, so every
// visible pool is selected and with the tail every token 0 .. pos[t]: dense causal attention.
#pragma once

#include <cstdint>

#include "ref/kernels.h"
#include "ref/tensor.h"

namespace indexshare::ref::kpool {

// ke[t] = min(floor((s_kv - s_q + t + 1) / P), floor(s_kv / P)): the pools visible to row t.
// Error unless 1 <= s_q <= s_kv and P >= 1.
Tensor<int32_t> visible_pools(int64_t s_q, int64_t s_kv, int64_t P);

// valid [s_q, n_pools] = 1 where p < ke[t] (the candidates), else 0.
Tensor<uint8_t> pool_validity(const Tensor<int32_t>& ke, int64_t n_pools);

// I [s_q, n_pools] from q [s_q, H, D], kbar [n_pools, D], weights [s_q, H] (w * H^-1/2, f32) for a
// sequence of s_kv keys with pools of P (kbar must have floor(s_kv / P) rows). Errors name the tensor.
Tensor<float> pool_scores(const Tensor<float>& q, const Tensor<float>& kbar, const Tensor<float>& weights,
                          int64_t s_kv, int64_t P, const Kernels& kern = {});

struct Selection {
  int64_t select_k = 0;    // min(index_topk / P, n_pools)
  Tensor<int32_t> pools;   // [s_q, select_k]  pool numbers, best first, -1 padded
  Tensor<int32_t> history; // [s_q, select_k * P]  the pools' tokens, each pool ascending, -1 padded
  Tensor<int32_t> tail;    // [s_q, P - 1]  the tail tokens ascending, -1 padded ([s_q, 0] without tail)
  Tensor<int32_t> indices; // [s_q, index_topk + P - 1] (index_topk without tail): history | tail | -1
};

// The selection from scores I [s_q, n_pools] (pool_scores) for s_kv keys. index_topk >= P and
// index_topk % P == 0 (transformers' config rule); Error otherwise. NaN scores inside a row's
// visible pools are an input error (ref::topk).
Selection select_tokens(const Tensor<float>& scores, int64_t s_kv, int64_t P, int64_t index_topk, bool tail,
                        const Kernels& kern = {});

}  // namespace indexshare::ref::kpool
