// indexshare: a GLM-5.3 KPool-DSA layer and stack at kernel level, from generated inputs.
//
//   k, g, ape -> pool_logits (g + ape) -> pool_keys (Kbar)            ref/kpool/pool.h
//   q, Kbar, w -> pool_scores (I) -> select_tokens (pools, history, tail, the union list)
//                                                                     ref/kpool/select.h
//   attention q, kv, the list -> ref::sparse_attention (NoPE MLA)     ref/attention.h
//
// The attention is GLM-5.3's absorbed NoPE MLA: one latent kv head of d_qk = 512 dims with no RoPE
// tail (SGLang's "tail_dim == 0"), V = the same 512 latent dims (d_v = 512), h_q query heads,
// sm_scale = 256^-1/2 by default (the unabsorbed qk_nope_head_dim = 256 of q . k). The index list
// holds token positions of the one sequence, which are the kv rows (ks = 0), -1 padded; the
// attention sums the valid ones in ascending row order, so the union list of a row that selected
// every pool (with its tail) gives dense causal attention bit for bit.
//
// Generated inputs of layer l (ref/rng.h streams, named after their golden tensor names with the
// prefix "layers.{l}."; values of cfg.dist). Per-row tensors are drawn for the whole sequence of
// s_kv positions and the query rows read the range of positions s_kv - s_q .. s_kv - 1, so a
// prefill chunk or a decode step sees exactly the bytes of the same rows of the whole prefill.
//   indexer.q       [s_q, H, D]   bf16 values (in f32)
//   indexer.k       [s_kv, D]     bf16 values (in f32): the LayerNorm'ed keys
//   indexer.gate    [s_kv, D]     bf16 values (in f32): the gate scores g
//   indexer.ape     [P, D]        f32, times 0.5 (an f32 parameter in transformers)
//   indexer.weights [s_q, H]      f32, times f32(H^-1/2) (one f32 multiply): weights_proj(x) * H^-1/2
//   attn.q          [s_q, h_q, d_qk]  bf16
//   attn.kv         [s_kv, 1, d_qk]   bf16
//
// The stack (index sharing, IndexShare / IndexCache) runs the DSA layers of a model whose other
// layers may be KDA (linear attention, not modelled here: they neither make nor consume an index
// list). GLM-5.3's default layer_types make layer i KDA when i % 4 != 3, so DSA sits at 3, 7, 11,
// .... A Full DSA layer runs its pooled indexer and makes its union list (history and tail) current;
// a Shared DSA layer runs no indexer and uses the current list verbatim (pools and tail depend only
// on the query position, so the reuse is layer-agnostic) with its own attention inputs. The
// schedule is over the DSA layers, in order; the first DSA layer must be Full. transformers hands a
// list only to the very next decoder layer (KDA layers return none), so there a Shared DSA layer
// after a KDA layer raises: the released model is all-Full, and a schedule should come from an
// explicit list (dsa_schedule below picks a model-wide list's entries at the DSA layers).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/kernels.h"
#include "ref/kpool/pool.h"
#include "ref/kpool/select.h"
#include "ref/rng.h"
#include "ref/schedule.h"
#include "ref/tensor.h"

namespace indexshare::ref::kpool {

struct KpoolConfig {
  int64_t s_q = 64, s_kv = 64;     // query rows (the last s_q of s_kv positions) and keys
  int64_t heads = 4, dim = 32;     // indexer heads H and head dim D (GLM-5.3: 32 x 128)
  int64_t pool = 4;                // P, index_kpool (GLM-5.3: 4; transformers' default 16)
  int64_t index_topk = 16;         // tokens of history per row (GLM-5.3: 2048); a multiple of P
  bool tail = true;                // index_kpool_always_select_tail
  PoolRounding rounding = PoolRounding::f32;
  int64_t h_q = 2, d_qk = 512, d_v = 512;  // NoPE MLA, absorbed (GLM-5.3: 64 heads)
  float sm_scale = 0.0625f;        // 256^-1/2
  uint64_t seed = 1;
  Dist dist = Dist::normal;
  // Error naming the field unless 1 <= s_q <= s_kv, heads, dim, pool, h_q >= 1,
  // index_topk a positive multiple of pool, 1 <= d_v <= d_qk, sm_scale finite and > 0.
  void validate() const;
  int64_t n_pools() const { return s_kv / pool; }
  int64_t width() const { return index_topk + (tail ? pool - 1 : 0); }  // the index list's columns
};

struct KpoolLayerInputs {
  bool has_indexer = true;  // false: a Shared layer (indexer tensors empty)
  Tensor<float> q;          // [s_q, H, D]
  Tensor<float> k;          // [s_kv, D]
  Tensor<float> g;          // [s_kv, D]
  Tensor<float> ape;        // [P, D]
  Tensor<float> weights;    // [s_q, H]
  Tensor<bf16_t> attn_q;    // [s_q, h_q, d_qk]
  Tensor<bf16_t> attn_kv;   // [s_kv, 1, d_qk]
};

struct KpoolIndexerOutputs {
  Tensor<float> z;          // [n_pools, P, D]  g + ape, the pooling logits
  Tensor<float> kbar;       // [n_pools, D]     pooled keys
  Tensor<int32_t> ke;       // [s_q]            visible pools per row
  Tensor<uint8_t> valid;    // [s_q, n_pools]   1 where the pool is a candidate
  Tensor<float> scores;     // [s_q, n_pools]   I, -inf where not valid
  Selection sel;            // pools, history, tail, indices
};

struct KpoolLayerOutputs {
  int model_layer = 0;      // the decoder layer number (the streams' l)
  bool full = true;
  int source = 0;           // model layer whose index list this layer used (itself when Full)
  std::optional<KpoolIndexerOutputs> indexer;  // Full layers only
  Tensor<int32_t> indices;  // [s_q, width] the union index list used (token positions, -1 padded)
  AttentionOut attn;
};

KpoolLayerInputs make_kpool_layer_inputs(const KpoolConfig& c, int layer, bool with_indexer = true,
                                         const Kernels& kern = {});
// The pooled indexer and the selection of a layer with indexer inputs.
KpoolIndexerOutputs run_kpool_indexer(const KpoolConfig& c, const KpoolLayerInputs& in, const Kernels& kern = {});
// ref::sparse_attention (kern's) over the list indices [s_q, width] (token positions = kv rows).
AttentionOut kpool_attention(const KpoolConfig& c, const KpoolLayerInputs& in, const Tensor<int32_t>& indices,
                             const Kernels& kern = {});
// One Full layer: indexer, selection, attention.
KpoolLayerOutputs run_kpool_layer(const KpoolConfig& c, const KpoolLayerInputs& in, int layer = 0,
                                  const Kernels& kern = {});

// ---- the stack ----
// GLM-5.3's default layer_types: layer i is DSA iff i % 4 == 3 (else KDA).
std::vector<bool> glm53_dsa_layers(int n_layers);
// The schedule over the DSA layers from a model-wide per-layer kind list (e.g. transformers'
// indexer_types, or a resolve_schedule result over all layers): the entries at the DSA layers, in
// order. Error if the sizes differ, there is no DSA layer, or the first DSA layer is Shared.
Schedule dsa_schedule(const std::vector<LayerKind>& per_layer, const std::vector<bool>& dsa);

struct KpoolStackSpec {
  std::vector<bool> dsa;    // per model layer: DSA (true) or KDA (false); all true: a pure DSA stack
  Schedule schedule;        // over the DSA layers, in order (schedule.n_layers() == count of DSA)
};

// Runs every DSA layer of the spec in order with generated inputs (Shared layers get no indexer
// inputs). Returns one KpoolLayerOutputs per DSA layer.
std::vector<KpoolLayerOutputs> run_kpool_stack(const KpoolConfig& c, const KpoolStackSpec& spec,
                                               const Kernels& kern = {});

}  // namespace indexshare::ref::kpool
