// indexshare: a Hunyuan HY V4 DSA layer and stack at kernel level (transformers' hy_v4 modeling:
// HYV4Indexer, HYV4Attention, eager_attention_forward).
//
// The indexer differs from DeepSeek-V3.2's in five places, all made explicit here:
//   * 16 heads x 128 (Config::heads, dim);
//   * RoPE on the TRAILING `rope` dims of each head: the head splits [D - rope pass | rope rot]
//     (DeepSeek-V3.2 rotates the leading ones). RopeSlice::leading is that other layout, kept to
//     show the difference (and as the planted mistake of the cross-check);
//   * k_norm is a LayerNorm (weight and bias, eps = rms_norm_eps = 1e-5) computed in f32;
//   * the head weights are w = weights_proj(x.float()) * f32(H^-1/2) * f32(D^-1/2), f32 products
//     left to right (transformers multiplies the f32 tensor by the Python floats H**-0.5 and
//     head_dim**-0.5; the first is 0.25 for H = 16, exact), ReLU of the plain dot products;
//   * no Hadamard rotation; the causal mask is applied before the top-k, and a pick of a masked
//     (-inf) key is -1 (transformers picks a masked key there, which its attention mask hides).
// The attention is MLA (q.k over 192 nope + 64 rope dims, v 256 per head) with two additions:
//   * a per-head learnable SINK: a zero key / zero value whose logit is `sink[h]` itself, next to
//     the scaled logits q.k * sm_scale; the sink is NOT multiplied by sm_scale. ref::sparse_attention's
//     attn_sink has exactly this meaning (out *= 1 / (1 + exp(sink - lse)), lse over the scaled
//     logits), so HY's sink is handed to it unchanged (gated_attention below). Scaling it (sink *
//     sm_scale) is a mistake the tests plant;
//   * a gated output: o[t, h, :] * sigmoid(gate[t, h, :]) (gate = linear_gate(x), v dims per head),
//     before o_proj.
// The kernel computes MLA in the absorbed (FlashMLA) form: one latent kv head [kv_lora | rope],
// V = the latent, then the per-head value up-projection W_uv [h_q][v][kv_lora]; transformers
// expands the latent to per-head keys and values, equal in exact arithmetic.
//
// Numerics (the f32 model is the specification; every step names its rounding):
//   k_norm   = ref::layer_norm(k, w, b, eps)          (double, one rounding to f32)
//   q_rope, k_rope: ref::apply_rope (f32 arithmetic, interleaved pairs, ref::rope_inv_freq(rope,
//            theta)) on the rope slice at absolute position p; the pass slice untouched. transformers'
//            apply_rotary_pos_emb_interleave writes the rotated pairs de-interleaved ([even' | odd']);
//            q and k get the same permutation, so every dot product is the same sum of the same
//            products. Here the pairs stay in place.
//   scores   = ref::indexer_logits_f32(q_rope, k_rope, k_scale = 1, weights, ks = 0, ke = p + 1)
//            (double, one rounding; -inf outside the causal window)
//   indices  = ref::topk(scores, ks, ke, index_topk): score descending, key ascending on ties,
//            -1 past the row's p + 1 causal keys
//   attention= ref::sparse_attention(q, kv, indices, sm_scale, d_v = kv_lora, sink): f32 latent out
//   o_v      = ref::head_linear(out, W_uv) (double sum, one rounding to f32), or out itself when
//            there is no W_uv (the per-head, unabsorbed form)
//   gated    = f32(o_v * sig), sig = f32(1 / (1 + exp_portable(-double(gate)))); gated_bf16 = bf16(gated)
// A bf16 model rounds k_norm to bf16 and runs RoPE in bf16 arithmetic in transformers: not modelled.
//
// Generated inputs of layer l (ref/rng.h streams "layers.{l}." + name, values of cfg.dist). The query
// rows are the last s_q of s_kv positions, drawn as the range of positions s_kv - s_q .. s_kv - 1.
//   indexer.q         [s_q, H, D]   bf16 values (in f32): wq_b(q_resid), before RoPE
//   indexer.k         [s_kv, D]     bf16 values (in f32): wk(x), before the LayerNorm
//   indexer.k_norm_w  [D]           f32: 1 + 0.1 * draw (f32 arithmetic)
//   indexer.k_norm_b  [D]           f32: 0.1 * draw
//   indexer.weights   [s_q, H]      f32: weights_proj(x.float()), before the two scales
//   attn.q            [s_q, h_q, kv_lora + attn_rope]   bf16 (absorbed query, roped)
//   attn.kv           [s_kv, 1, kv_lora + attn_rope]    bf16 (latent and roped key)
//   attn.w_uv         [h_q, v, kv_lora]  bf16 values (in f32): f32(kv_lora^-1/2) * draw, then bf16
//   attn.gate         [s_q, h_q, v] bf16 values (in f32): linear_gate(x)
//   attn.sink         [h_q]         f32 (empty when Config::sink is false: attention without a sink)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/kernels.h"
#include "ref/rng.h"
#include "ref/schedule.h"
#include "ref/tensor.h"

namespace indexshare::ref::hyv4 {

// Which dims of an indexer head the RoPE rotates.
enum class RopeSlice {
  trailing,  // HY V4: [D - rope pass | rope rot]
  leading,   // DeepSeek-V3.2: [rope rot | D - rope pass]
};
std::string rope_slice_name(RopeSlice s);                 // "trailing" / "leading"
RopeSlice parse_rope_slice(const std::string& name);      // Error naming the value

struct Config {
  int64_t s_q = 32, s_kv = 32;           // query rows (the last s_q of s_kv positions) and keys
  int64_t heads = 4, dim = 32, rope = 16;  // indexer H x D and its rope dims (HY V4: 16 x 128, 64)
  int64_t index_topk = 8;                // HY V4: 2048
  float norm_eps = 1e-5f;                // k_norm's LayerNorm eps (rms_norm_eps)
  double rope_theta = 10000.0;           // rope_parameters.rope_theta
  RopeSlice slice = RopeSlice::trailing;
  int64_t h_q = 2, kv_lora = 64, attn_rope = 16, v_dim = 32;  // HY V4: 32, 512, 64, 256
  float sm_scale = 0.0625f;              // (qk_nope + qk_rope)^-1/2 = 256^-1/2
  bool sink = true;                      // the per-head sink (HY V4 has one); false: none, attn.sink empty
  uint64_t seed = 1;
  Dist dist = Dist::normal;
  // Error naming the field unless 1 <= s_q <= s_kv; heads, dim, index_topk, h_q, kv_lora, v_dim >= 1;
  // rope even with 2 <= rope <= dim; attn_rope >= 0; norm_eps finite >= 0; rope_theta finite > 0;
  // sm_scale finite > 0.
  void validate() const;
  int64_t d_qk() const { return kv_lora + attn_rope; }
};

// The released model's shapes (16 x 128 indexer, rope 64, top-2048, 32 heads, kv_lora 512, v 256)
// for s_kv positions (s_q = s_kv).
Config hy_v4_config(int64_t s_kv);

struct LayerInputs {
  bool has_indexer = true;  // false: a Shared layer (the indexer tensors are empty)
  Tensor<float> q, k, k_norm_w, k_norm_b, weights;  // indexer.* (see the header)
  Tensor<bf16_t> attn_q, attn_kv;
  Tensor<float> w_uv, gate, sink;
};
LayerInputs make_layer_inputs(const Config& c, int layer, bool with_indexer = true, const Kernels& kern = {});

// ---- the indexer ----
struct IndexerParams {
  int64_t rope = 64;
  double theta = 10000.0;
  RopeSlice slice = RopeSlice::trailing;
  float eps = 1e-5f;
  int64_t index_topk = 2048;
};
IndexerParams indexer_params(const Config& c);

struct IndexerOutputs {
  Tensor<float> k_norm;     // [s_kv, D]   f32 LayerNorm of k
  Tensor<float> q_rope;     // [s_q, H, D] q with its rope slice rotated
  Tensor<float> k_rope;     // [s_kv, D]
  Tensor<float> weights;    // [s_q, H]    (raw * f32(H^-1/2)) * f32(D^-1/2)
  Tensor<int32_t> ks, ke;   // [s_q]       the causal window [0, p + 1)
  Tensor<float> scores;     // [s_q, s_kv] -inf outside the window
  Tensor<int32_t> indices;  // [s_q, index_topk] key positions, -1 padded
};

// The head weights (raw [s_q, H] * f32(H^-1/2)) * f32(head_dim^-1/2): two f32 products, in this
// order; f32(n^-1/2) = f32(1 / sqrt(double(n))).
Tensor<float> indexer_weights(const Tensor<float>& raw, int64_t head_dim);
// Rotates the rope slice of every row of x [rows, ..., D] (the last dim a head of D dims), row r at
// position first_pos + r; every head of a row shares the row's position.
void rope_slice(Tensor<float>& x, int64_t first_pos, const IndexerParams& p);
// The indexer on the caller's tensors: q [s_q, H, D], k [s_kv, D] (before the LayerNorm),
// k_norm_w / k_norm_b [D], weights_raw [s_q, H]; the query rows are the last s_q of s_kv positions.
// Error naming the tensor on a shape mismatch. indexer_front: its steps before the scores (k_norm,
// q_rope, k_rope, weights, ks, ke; scores and indices left empty); run_indexer: the whole indexer.
IndexerOutputs indexer_front(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& k_norm_w,
                             const Tensor<float>& k_norm_b, const Tensor<float>& weights_raw, const IndexerParams& p);
IndexerOutputs run_indexer(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& k_norm_w,
                           const Tensor<float>& k_norm_b, const Tensor<float>& weights_raw, const IndexerParams& p,
                           const Kernels& kern = {});

// ---- the attention ----
struct AttentionOutputs {
  AttentionOut attn;          // the kernel's: latent out [s_q, h_q, d_v], lse / max_logits WITHOUT the sink
  Tensor<float> o_v;          // [s_q, h_q, v] after W_uv (or attn.out when there is none)
  Tensor<float> gated;        // [s_q, h_q, v] o_v * sigmoid(gate): o_proj's input
  Tensor<bf16_t> gated_bf16;  // bf16(gated)
};
// q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16, indices [s_q, topk] (kv rows, -1 ignored),
// sink [h_q] f32 (an unscaled logit, handed to the kernel unchanged; empty: no sink), d_v the kernel's value dims,
// w_uv [h_q, v, d_v] or null (then v = d_v), gate [s_q, h_q, v].
AttentionOutputs gated_attention(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                 const Tensor<float>& sink, float sm_scale, int64_t d_v, const Tensor<float>* w_uv,
                                 const Tensor<float>& gate, const Kernels& kern = {});

// ---- a layer and the stack ----
struct LayerOutputs {
  int layer = 0;
  bool full = true;
  int source = 0;                         // the layer whose indices this layer used
  std::optional<IndexerOutputs> indexer;  // Full layers only
  Tensor<int32_t> indices;                // [s_q, index_topk]
  AttentionOutputs attn;
};
LayerOutputs run_layer(const Config& c, const LayerInputs& in, int layer = 0, const Kernels& kern = {});
// Index sharing: a Full layer runs its indexer, a Shared layer reuses the indices of the most recent
// Full layer (transformers threads the top-k through every decoder layer). HY V4's default schedule
// is schedule_preset("hy-v4", n): Full iff i == 0 or (i - 1) % 4 == 0, F F S S S F S S S F ...
std::vector<LayerOutputs> run_stack(const Config& c, const Schedule& s, const Kernels& kern = {});

}  // namespace indexshare::ref::hyv4
