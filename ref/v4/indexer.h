// indexshare: DeepSeek-V4's lightning indexer over compressed blocks (CSA layers only).
//
// The indexer has its own compressor (ref/v4/compressor.h, overlap, ratio m = 4, D_I = 128): its
// entries K[s] (s = 0 .. n_b - 1, n_b = floor(T / m)) are the keys; the queries are the indexer's
// per-head q[t, h] (after the layer's compress RoPE, at position t) and the head weights
// w[t, h] = weights_proj(x)[t, h] * H^-0.5 (f32). Query rows are the positions t = 0 .. T - 1.
//
//   rotation (by name): "megatron" / "hadamard" rotates q[t, h] and K[s] by the Hadamard
//     transform (ref::hadamard_transform: f32 butterfly, times f32(D^-0.5); no bf16 rounding here)
//     before scoring; "hf" / "none" (transformers) does not. D must be a power of two to rotate.
//     The normalised Hadamard matrix is orthogonal, so rotating both sides leaves every q . K
//     unchanged up to rounding: in this unquantized indexer the two names differ in the last bits
//     only. The rotation exists for quantization (it spreads outliers before an FP8 cast), which
//     is where it changes the scores.
//   I[t, s] = sum_h w[t, h] * ReLU(q[t, h] . K[s]) * D^-1/2        for s < floor((t + 1) / m)
//   I[t, s] = -inf                                                  otherwise (block not complete
//                                                                   at position t: not causal)
//   evaluated as ref::indexer_logits_f32(q, K, k_scale, w, ks, ke) with ks[t] = 0,
//   ke[t] = min(floor((t + 1) / m), n_b) and k_scale[s] = f32(D^-0.5) for every block: the dot
//   products and the head sum in double (h ascending, multiply then add), times double(k_scale),
//   rounded to f32 once. So the D^-1/2 is applied exactly (in double, after the head sum) and only
//   the constant itself is rounded to f32, as transformers' `* softmax_scale` on f32 tensors; the
//   V3.2 layer's indexer code (and its simd mirror) computes these logits unchanged.
//   transformers computes (ReLU(dot) * D^-1/2) * w in f32 and sums the heads in f32, so it
//   differs from these logits by f32 rounding only (tests/python/test_v4_hf.py).
//
// Selected blocks: k = min(index_topk, n_b) per row (every row has the same width k), chosen by
// ref::topk over [0, ke[t]) (score descending, then index ascending); the slots beyond a row's
// ke[t] valid blocks hold -1 (transformers: the picks at or past the causal threshold become -1).
#pragma once

#include <cstdint>
#include <string>

#include "ref/kernels.h"
#include "ref/tensor.h"

namespace indexshare::ref::v4 {

enum class IndexerRotation { none, hadamard };
std::string rotation_name(IndexerRotation r);  // "hf" / "megatron"
// "hf" or "none"; "megatron" or "hadamard"; throws Error naming the bad value.
IndexerRotation parse_rotation(const std::string& name);

// ke[t] = min(floor((t + 1) / ratio), n_blocks) for t = 0 .. T - 1: the blocks complete at t.
Tensor<int32_t> causal_block_end(int64_t T, int64_t ratio, int64_t n_blocks);

// q [T, H, D] f32, k_comp [n_b, D] f32 (the indexer compressor's entries), weights [T, H] f32.
// Returns I [T, n_b] (see the header). Rotation copies q and k_comp; the inputs are unchanged.
Tensor<float> index_scores(const Tensor<float>& q, const Tensor<float>& k_comp, const Tensor<float>& weights,
                           int64_t ratio, IndexerRotation rotation, const Kernels& kern = {});

// The selected blocks [T, min(index_topk, n_b)] of scores I [T, n_b]: block numbers in score order,
// -1 padded past each row's valid blocks. index_topk >= 1.
Tensor<int32_t> select_blocks(const Tensor<float>& scores, int64_t ratio, int64_t index_topk,
                              const Kernels& kern = {});

}  // namespace indexshare::ref::v4
