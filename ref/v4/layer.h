// indexshare: one DeepSeek-V4 attention layer at kernel level, from generated inputs to outputs.
//
// V4 has three layer types (transformers `layer_types`, or the checkpoint's `compress_ratios`
// 0 / 4 / 128): sliding-window attention only ("SWA"), compressed sparse attention ("C4A": window
// plus the top-k of the 4:1 compressed entries chosen by the indexer) and heavily compressed
// attention ("HCA": window plus every causally complete 128:1 entry, no indexer). V4-Flash: 43
// layers, 0-1 SWA, then C4A on the even layers 2-42 and HCA on the odd layers 3-41 (schedule.h).
//
//   C4A:  compressor (m = 4, overlap, D)  -> entries E [n_c, D]
//         indexer compressor (m = 4, D_I) -> K [n_b, D_I];  I = index_scores(q_I, K, w);  blocks = top-k
//   HCA:  compressor (m = 128, no overlap) -> entries E [n_c, D];  blocks = every complete one
//   all:  kv_full = [kv (T tokens) ; bf16(E)]  [T + n_c, 1, D]
//         indices[t] = window [t - W + 1 .. t] (-1 below 0, width W) ++ (T + block) per block (-1 kept)
//         attention = ref::sparse_attention(q, kv_full, indices, D^-1/2, d_v = D, sink): ONE softmax
//                     over window and compressed entries, K = V (all D columns), the per-head sink
//         out       = that f32 output with the inverse RoPE (-sin, compressor.h apply_rope_inverse) at
//                     the query position t on its trailing rope_dim channels, in f32; out_bf16 =
//                     bf16(out) (lse and max_logits are the attention's: the rotation does not
//                     change them). RoPE: the layer's "compress" RoPE for C4A / HCA, "main" for SWA.
//
// Query rows are the positions t = 0 .. T - 1 of one sequence (a prefill from position 0); the
// block rule is s < floor((t + 1) / m) for both C4A and HCA. A Shared C4A layer (IndexCache,
// schedule.h) runs no indexer and takes its source layer's blocks: only the block numbers are
// shared, the entries are the layer's own.
//
// Generated inputs of layer l (stream names, prefix "layers.{l}."; values from cfg.dist under
// cfg.seed, ref/rng.h), what the kernels read:
//   attn.q        [T, H, D]        bf16 (after the model's q norm and RoPE)
//   attn.kv       [T, D]           bf16 (after kv_norm and RoPE)
//   attn.sink     [H]              f32
//   compressor.kv, compressor.gate [T, 2D] (C4A) or [T, D] (HCA)  bf16 values (f32 tensors)
//   compressor.position_bias       [m, width]  f32, dist x 0.5
//   compressor.norm_weight         [D]         f32, 1 + uniform x 0.25
//   indexer.kv, indexer.gate       [T, 2 D_I]  bf16 values;  indexer.position_bias [4, 2 D_I];
//   indexer.norm_weight [D_I]; indexer.q [T, H_I, D_I] bf16 values (after the compress RoPE);
//   indexer.weights [T, H_I] f32 = bf16(raw) * f32(H_I^-0.5)   (weights_proj(x) * H^-0.5)
// Outputs a golden set holds (same prefix): compressor.entries [n_c, D], indexer.entries
// [n_b, D_I], indexer.scores [T, n_b], indexer.blocks [T, k] (k = min(index_topk, n_b)),
// attn.indices [T, 1, W + width], attn.out / attn.out_bf16 [T, H, D], attn.lse, attn.max_logits [T, H].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/kernels.h"
#include "ref/rng.h"
#include "ref/tensor.h"
#include "ref/v4/compressor.h"
#include "ref/v4/indexer.h"

namespace indexshare::ref::v4 {

enum class LayerType { sliding, csa, hca };
std::string layer_type_name(LayerType t);  // transformers' names: sliding_attention, ...
char layer_type_char(LayerType t);         // 'S', 'C', 'H'
// "S" / "C" / "H", or transformers' names; throws Error naming the bad value.
LayerType parse_layer_type(const std::string& name);

struct Config {
  int64_t n_tokens = 48;        // T
  int64_t n_heads = 2;          // H (V4-Flash 64)
  int64_t head_dim = 64;        // D = NoPE + RoPE (V4: 512 = 448 + 64)
  int64_t window = 8;           // W (V4: 128)
  int64_t csa_ratio = 4;        // m
  int64_t hca_ratio = 8;        // m' (V4: 128)
  int64_t index_n_heads = 4;    // H_I (V4: 64)
  int64_t index_head_dim = 32;  // D_I (V4: 128)
  int64_t index_topk = 4;       // (V4: 512)
  float eps = 1e-6f;            // rms_norm_eps
  RopeParams main_rope, compress_rope;  // rope_dim <= index_head_dim
  IndexerRotation rotation = IndexerRotation::none;
  Dist dist = Dist::normal;
  uint64_t seed = 1;
  float sm_scale() const;       // f32(D^-0.5)
  void validate() const;        // throws Error naming the field
};
// A tiny config for tests (above, rope_dim 16, YaRN as V4 with original_max_pos 32).
Config tiny_config();
// V4-Flash's attention shapes for a prefill of T tokens: H 64, D 512 (rope 64), W 128, m 4 / 128,
// indexer 64 x 128, top-512, eps 1e-6, V4's main and compress RoPE.
Config flash_config(int64_t n_tokens);

struct LayerInputs {
  LayerType type = LayerType::sliding;
  Tensor<bf16_t> q;     // [T, H, D]
  Tensor<bf16_t> kv;    // [T, D]
  Tensor<float> sink;   // [H]
  Tensor<float> comp_kv, comp_gate, comp_bias, comp_norm;  // empty for SWA
  bool has_indexer = false;  // C4A Full layers
  Tensor<float> index_kv, index_gate, index_bias, index_norm;
  Tensor<float> index_q;        // [T, H_I, D_I]
  Tensor<float> index_weights;  // [T, H_I]
};

struct LayerOutputs {
  Tensor<float> entries;        // compressor.entries [n_c, D] (empty for SWA)
  Tensor<float> index_entries;  // indexer.entries [n_b, D_I] (Full C4A only)
  Tensor<float> index_scores;   // indexer.scores [T, n_b] (Full C4A only)
  Tensor<int32_t> blocks;       // indexer.blocks [T, k]: C4A, own or the source's
  Tensor<int32_t> indices;      // attn.indices [T, 1, W + width], rows of kv_full
  Tensor<bf16_t> kv_full;       // [T + n_c, 1, D]
  AttentionOut attn;            // out after the inverse RoPE, out_bf16 = bf16(out), lse, max_logits
};

CompressorParams compressor_params(const Config& cfg, LayerType t);  // C4A or HCA
CompressorParams indexer_compressor_params(const Config& cfg);

LayerInputs make_layer_inputs(const Config& cfg, int layer, LayerType type, bool with_indexer,
                              const Kernels& kern = {});

// [T, W]: slot i of row t is t - W + 1 + i, or -1 where that is negative.
Tensor<int32_t> window_indices(int64_t T, int64_t W);
// [T, 1, W + width]: the window, then T + each compressed entry of the row: C4A the blocks
// [T, k] (-1 kept), HCA every entry j < floor((t + 1) / m') (width n_c, -1 past the causal bound),
// SWA none.
Tensor<int32_t> attention_indices(const Config& cfg, LayerType type, int64_t n_c, const Tensor<int32_t>* blocks);

// Steps 3-4 of the layer alone (what a kernel given the entries computes): fills out.indices,
// out.kv_full and out.attn from q, the token kv, the sink, the compressor's entries ([n_c, D];
// empty for SWA) and, for C4A, the blocks [T, k].
void attend(const Config& cfg, LayerType type, const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv,
            const Tensor<float>& sink, const Tensor<float>& entries, const Tensor<int32_t>* blocks, LayerOutputs& out,
            const Kernels& kern = {});

// Calls fn(name, tensor, is_input) for every non-empty tensor of a layer under its golden name
// (prefix + the names of the header comment, e.g. "layers.2.compressor.entries"), inputs first;
// `tensor` is a Tensor<bf16_t>, Tensor<float> or Tensor<int32_t> (fn is generic). The one list a
// golden writer needs.
template <class Fn>
void visit_tensors(const LayerInputs& in, const LayerOutputs& out, const std::string& prefix, Fn&& fn) {
  auto put = [&](const char* name, const auto& t, bool input) {
    if (t.numel() > 0) fn(prefix + name, t, input);
  };
  put("attn.q", in.q, true);
  put("attn.kv", in.kv, true);
  put("attn.sink", in.sink, true);
  put("compressor.kv", in.comp_kv, true);
  put("compressor.gate", in.comp_gate, true);
  put("compressor.position_bias", in.comp_bias, true);
  put("compressor.norm_weight", in.comp_norm, true);
  put("indexer.kv", in.index_kv, true);
  put("indexer.gate", in.index_gate, true);
  put("indexer.position_bias", in.index_bias, true);
  put("indexer.norm_weight", in.index_norm, true);
  put("indexer.q", in.index_q, true);
  put("indexer.weights", in.index_weights, true);
  put("compressor.entries", out.entries, false);
  put("indexer.entries", out.index_entries, false);
  put("indexer.scores", out.index_scores, false);
  put("indexer.blocks", out.blocks, false);
  put("attn.indices", out.indices, false);
  put("attn.out", out.attn.out, false);
  put("attn.out_bf16", out.attn.out_bf16, false);
  put("attn.lse", out.attn.lse, false);
  put("attn.max_logits", out.attn.max_logits, false);
}

// The layer. shared_blocks: for a Shared C4A layer, the source layer's blocks (the layer's own
// indexer is not run and its indexer inputs are not read); null for a Full one.
LayerOutputs run_layer(const Config& cfg, const LayerInputs& in, const Tensor<int32_t>* shared_blocks = nullptr,
                       const Kernels& kern = {});

}  // namespace indexshare::ref::v4
