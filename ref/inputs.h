// indexshare: the generated kernel inputs of a DSA layer (ref/layer.h runs the layer on them).
//
// Generated inputs of layer l. Every tensor has its own reproducible random stream under the
// problem's seed, named after its golden tensor name with the prefix "layers.{l}.".
//   indexer q, k, weights: a cross-layer mix of a base drawn once for the stack (streams
//       "stack.indexer.{q,k,weights}") and the layer's own draw (streams "layers.{l}.indexer.*"):
//           v = a * base + b * own   in f32, a = sim, b = f32(sqrt(1 - sim^2))
//       so that at sim = 1 every layer has the same indexer inputs (top-k overlap 1) and at
//       sim = 0 the layers are independent (overlap near chance), with unit variance between.
//       With drift = rho > 0 the layer's own part is instead an AR(1) chain across layers, as in
//       real models, where adjacent layers choose much the same keys and the overlap decays with
//       layer distance (IndexCache: 0.7-1.0 for adjacent layers):
//           c_0 = own_0,   c_l = r_l * c_{l-1} + f32(sqrt(1 - r_l^2)) * own_l   (f32, in order)
//       with r_l = rho, or jumprho at a layer that jumps (probability `jumps` per layer, drawn
//       from the stream "stack.drift.jump.{l}"); the correlation of two layers' own parts is
//       the product of the r between them (rho^distance without jumps). Layer l's inputs then
//       read the own streams of layers 0..l (O(l) generation). drift = 0: exactly the bytes of
//       the independent draws above.
//   recency and sinks (real indexers favour recent and first tokens): two reserved dims of the
//       indexer head, d_r = D - 1 and d_s = D - 2 (when D >= 2), are overwritten with
//           q[t, h, d_r] = q[t, h, d_s] = sign(w[t, h]) * g,      g = f32(2 * D^(1/4))
//           k[s, d_r] = recency * g * (s + 1) / s_kv              (grows with the key position)
//           k[s, d_s] = g if s < sinks else 0
//       adding recency * 4 sqrt(D) (s + 1) / s_kv and, for the first `sinks` keys, 4 sqrt(D) to the
//       dot product with the sign that raises w * ReLU(dot): comparable to the dot product's
//       standard deviation sqrt(D) at recency ~ 0.25. Off (no overwrite) at the defaults 0.
//   indexer.q       [s_q, H, D]   the values above rounded to bf16 (the Hadamard output is bf16),
//                                 then (fp8 mode) quantized per (t, h) with the problem's scale
//                                 rule, block D: codes plus q_scale [s_q, H]
//   indexer.k       [s_kv, D]     likewise, k_scale [s_kv] (bf16 mode: k_scale = 1)
//   indexer.weights [s_q, H]      f32: w * H^-0.5 * q_scale * D^-0.5, left to right in f32
//                                 (the upstream `weights_proj(x) * H^-0.5 * q_scale * D^-0.5`)
//   indexer.ks/ke   [s_q]         the row's sequence start in the kv rows, and that plus
//                                 start + local_t + 1 (causal: the row sees its own key; one
//                                 sequence: 0 and s_kv - s_q + t + 1)
//   attn.q          [s_q, h_q, d_qk]   bf16(dist), the layer's own stream
//   attn.kv         [s_kv, 1, d_qk]    bf16(dist), the layer's own stream
//   attn.sink       [h_q]              per the sink option: dist, +inf or -inf
//
// Sampled query rows (make_layer_inputs with `rows`, the CLI's --rows): the inputs of a chosen
// list of query rows only, for exact goldens of a few rows at 128K-1M context. Every per-row
// tensor (indexer q, q_scale, weights, ks, ke and attn q) holds in its row r exactly the bytes the
// full problem holds in row rows[r]: each generated stream is read from the element range of
// that row (ref/rng.h fill_range), and every per-row step (the cross-layer mix, the recency/sink
// overwrite, bf16, the FP8 scale of each (t, h), the weights' scaling) depends on that row alone;
// ks/ke are the original row's window, so the indexer, top-k and attention need no other change.
// Key-side tensors (indexer k, k_scale, attn kv, sink) are whole: every row scores every key.
// The indexer's q and k are generated a block of rows or keys at a time, the blocks in parallel
// (the same bytes: every step is per row; the f32 draws are never held whole).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ref/kernels.h"
#include "ref/problem.h"
#include "ref/tensor.h"

namespace indexshare::ref {

struct LayerInputs {
  bool has_indexer = true;       // false: a Shared layer without indexer inputs (tensors empty)
  // Indexer, FP8 mode (codes) or bf16 mode (values in f32); the unused pair is empty.
  Tensor<e4m3_t> index_q8;       // [s_q, H, D]
  Tensor<e4m3_t> index_k8;       // [s_kv, D]
  Tensor<float> index_q;         // [s_q, H, D] (bf16 mode)
  Tensor<float> index_k;         // [s_kv, D]   (bf16 mode)
  Tensor<float> index_q_scale;   // [s_q, H]    (1 in bf16 mode)
  Tensor<float> index_k_scale;   // [s_kv]
  Tensor<float> index_weights;   // [s_q, H]
  Tensor<int32_t> ks, ke;        // [s_q]
  // Attention.
  Tensor<bf16_t> q;              // [s_q, h_q, d_qk]
  Tensor<bf16_t> kv;             // [s_kv, 1, d_qk]
  std::optional<Tensor<float>> sink;  // [h_q]
};

// Inputs of layer `layer`; with_indexer = false leaves the indexer tensors empty (ks/ke are
// always filled: the attention of every layer uses the same causal windows).
LayerInputs make_layer_inputs(const Problem& p, int layer = 0, bool with_indexer = true);
// Inputs of the query rows `rows` only (problem row numbers in [0, s_q), any order, no
// duplicates; see the header comment): per-row tensors have rows.size() rows, in that order.
// make_layer_inputs(p, l, w) equals make_layer_inputs(p, l, w, all_rows(p)).
// The generator's fills come from the kernel table (simd's: the same values, faster).
LayerInputs make_layer_inputs(const Problem& p, int layer, bool with_indexer, std::span<const int64_t> rows,
                              const Kernels& k = {});
// 0, 1, ..., s_q - 1.
std::vector<int64_t> all_rows(const Problem& p);
// Error ("rows: row 7 is listed twice", "... outside [0, sq = 8)", "... empty") unless `rows` is a
// non-empty list of distinct rows in [0, s_q).
void check_rows(const Problem& p, std::span<const int64_t> rows);
// A row list as text: runs of consecutive ascending rows as A-B, e.g. "0,17,100-131".
std::string format_rows(std::span<const int64_t> rows);
// Generated tensor of `shape` from the stream `name` (values of p.dist times `scale`).
Tensor<float> generate(const Problem& p, const std::string& name, const Shape& shape, float scale = 1.0f);
// The rows `rows` (along dim 0) of generate(p, name, shape, scale), without generating the others:
// shape [rows.size(), shape[1:]], bit-identical to the corresponding rows of the full tensor.
Tensor<float> generate_rows(const Problem& p, const std::string& name, const Shape& shape,
                            std::span<const int64_t> rows, float scale = 1.0f, const Kernels& k = {});
// bf16 of generate_rows (f32_to_bf16 of every value: the same bytes), one chunk of the stream at a
// time, the chunks in parallel: the f32 values are never held whole (attn.q at s_q 4096, h_q 64 is
// 600 MB of f32).
Tensor<bf16_t> generate_rows_bf16(const Problem& p, const std::string& name, const Shape& shape,
                                  std::span<const int64_t> rows, float scale = 1.0f, const Kernels& k = {});

}  // namespace indexshare::ref
