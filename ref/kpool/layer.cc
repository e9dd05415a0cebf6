// indexshare: a GLM-5.3 KPool-DSA layer and stack at kernel level. The contract is in layer.h.
#include "ref/kpool/layer.h"

#include <cmath>

#include "ref/draw.h"
#include "ref/error.h"
#include "ref/numerics.h"

namespace indexshare::ref::kpool {

void KpoolConfig::validate() const {
  require(s_q >= 1 && s_q <= s_kv, "kpool config s_q: need 1 <= s_q <= s_kv, got s_q " + std::to_string(s_q) +
                                       ", s_kv " + std::to_string(s_kv));
  require(heads >= 1, "kpool config heads: must be >= 1, got " + std::to_string(heads));
  require(dim >= 1, "kpool config dim: must be >= 1, got " + std::to_string(dim));
  require(pool >= 1, "kpool config pool: must be >= 1, got " + std::to_string(pool));
  require(index_topk >= pool && index_topk % pool == 0,
          "kpool config index_topk: must be a positive multiple of pool = " + std::to_string(pool) + ", got " +
              std::to_string(index_topk));
  require(h_q >= 1, "kpool config h_q: must be >= 1, got " + std::to_string(h_q));
  require(d_v >= 1 && d_v <= d_qk, "kpool config d_v: need 1 <= d_v <= d_qk, got d_v " + std::to_string(d_v) +
                                       ", d_qk " + std::to_string(d_qk));
  require(std::isfinite(sm_scale) && sm_scale > 0.0f, "kpool config sm_scale: must be finite and > 0");
}

namespace {
Tensor<float> draw_rows(const KpoolConfig& c, const std::string& name, Shape shape, int64_t first, float scale,
                        const Kernels& kern) {
  return ref::draw_rows(kern, c.dist, c.seed, name, std::move(shape), first, scale);
}

Tensor<float> draw_rows_bf16_values(const KpoolConfig& c, const std::string& name, Shape shape, int64_t first,
                                    const Kernels& kern) {
  Tensor<float> t = draw_rows(c, name, std::move(shape), first, 1.0f, kern);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = round_bf16(t[i]);
  return t;
}

Tensor<bf16_t> draw_rows_bf16(const KpoolConfig& c, const std::string& name, Shape shape, int64_t first,
                              const Kernels& kern) {
  return ref::draw_rows_bf16(kern, c.dist, c.seed, name, std::move(shape), first);
}
}  // namespace

KpoolLayerInputs make_kpool_layer_inputs(const KpoolConfig& c, int layer, bool with_indexer, const Kernels& kern) {
  c.validate();
  const std::string pre = "layers." + std::to_string(layer) + ".";
  const int64_t first = c.s_kv - c.s_q;  // the first query row's position
  KpoolLayerInputs in;
  in.has_indexer = with_indexer;
  if (with_indexer) {
    in.q = draw_rows_bf16_values(c, pre + "indexer.q", {c.s_q, c.heads, c.dim}, first, kern);
    in.k = draw_rows_bf16_values(c, pre + "indexer.k", {c.s_kv, c.dim}, 0, kern);
    in.g = draw_rows_bf16_values(c, pre + "indexer.gate", {c.s_kv, c.dim}, 0, kern);
    in.ape = draw_rows(c, pre + "indexer.ape", {c.pool, c.dim}, 0, 0.5f, kern);
    in.weights = draw_rows(c, pre + "indexer.weights", {c.s_q, c.heads}, first, 1.0f, kern);
    const float h_scale = float(1.0 / std::sqrt(double(c.heads)));
    for (int64_t i = 0; i < in.weights.numel(); ++i) in.weights[i] = in.weights[i] * h_scale;
  }
  in.attn_q = draw_rows_bf16(c, pre + "attn.q", {c.s_q, c.h_q, c.d_qk}, first, kern);
  in.attn_kv = draw_rows_bf16(c, pre + "attn.kv", {c.s_kv, 1, c.d_qk}, 0, kern);
  return in;
}

KpoolIndexerOutputs run_kpool_indexer(const KpoolConfig& c, const KpoolLayerInputs& in, const Kernels& kern) {
  c.validate();
  require(in.has_indexer, "kpool layer: this layer has no indexer inputs (a Shared layer)");
  require_shape(in.k, {c.s_kv, c.dim}, "kpool k");
  require_shape(in.ape, {c.pool, c.dim}, "kpool ape");
  check_pool_inputs(in.k, in.g, in.ape);
  KpoolIndexerOutputs o;
  o.z = pool_logits(in.g, in.ape);
  o.kbar = kern.kpool_pool_keys(in.k, o.z, c.rounding);
  o.ke = visible_pools(c.s_q, c.s_kv, c.pool);
  o.valid = pool_validity(o.ke, c.n_pools());
  o.scores = pool_scores(in.q, o.kbar, in.weights, c.s_kv, c.pool, kern);
  o.sel = select_tokens(o.scores, c.s_kv, c.pool, c.index_topk, c.tail, kern);
  return o;
}

AttentionOut kpool_attention(const KpoolConfig& c, const KpoolLayerInputs& in, const Tensor<int32_t>& indices,
                             const Kernels& kern) {
  require_shape(indices, {c.s_q, c.width()}, "kpool indices");
  Tensor<int32_t> idx = indices;
  idx.shape = {c.s_q, 1, c.width()};  // FlashMLA's [s_q, 1, topk] layout
  return kern.sparse_attention(in.attn_q, in.attn_kv, idx, c.sm_scale, c.d_v, nullptr, nullptr);
}

KpoolLayerOutputs run_kpool_layer(const KpoolConfig& c, const KpoolLayerInputs& in, int layer, const Kernels& kern) {
  KpoolLayerOutputs o;
  o.model_layer = o.source = layer;
  o.indexer = run_kpool_indexer(c, in, kern);
  o.indices = o.indexer->sel.indices;
  o.attn = kpool_attention(c, in, o.indices, kern);
  return o;
}

std::vector<bool> glm53_dsa_layers(int n_layers) {
  require(n_layers >= 1, "kpool stack: n_layers must be >= 1, got " + std::to_string(n_layers));
  std::vector<bool> dsa(size_t(n_layers), false);
  for (int i = 0; i < n_layers; ++i) dsa[size_t(i)] = i % 4 == 3;
  return dsa;
}

Schedule dsa_schedule(const std::vector<LayerKind>& per_layer, const std::vector<bool>& dsa) {
  require(per_layer.size() == dsa.size(), "kpool schedule: " + std::to_string(per_layer.size()) +
                                              " indexer types for " + std::to_string(dsa.size()) + " layers");
  Schedule s;
  for (size_t i = 0; i < dsa.size(); ++i)
    if (dsa[i]) s.kinds.push_back(per_layer[i]);
  require(!s.kinds.empty(), "kpool schedule: the model has no DSA layer");
  require(s.kinds[0] == LayerKind::full, "kpool schedule: the first DSA layer is shared, but a shared layer "
                                         "needs a preceding full DSA layer");
  return s;
}

std::vector<KpoolLayerOutputs> run_kpool_stack(const KpoolConfig& c, const KpoolStackSpec& spec, const Kernels& kern) {
  c.validate();
  std::vector<int> layers;  // the model layer numbers of the DSA layers
  for (size_t i = 0; i < spec.dsa.size(); ++i)
    if (spec.dsa[i]) layers.push_back(int(i));
  require(int(layers.size()) == spec.schedule.n_layers(),
          "kpool stack: the schedule has " + std::to_string(spec.schedule.n_layers()) + " layers for " +
              std::to_string(layers.size()) + " DSA layers");
  spec.schedule.validate();
  std::vector<KpoolLayerOutputs> out;
  Tensor<int32_t> current;  // the union list of the most recent Full DSA layer
  int current_source = -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int l = layers[i];
    const bool full = spec.schedule.is_full(int(i));
    const KpoolLayerInputs in = make_kpool_layer_inputs(c, l, full, kern);
    if (full) {
      out.push_back(run_kpool_layer(c, in, l, kern));
      current = out.back().indices;
      current_source = l;
    } else {
      KpoolLayerOutputs o;
      o.model_layer = l;
      o.full = false;
      o.source = current_source;
      o.indices = current;
      o.attn = kpool_attention(c, in, o.indices, kern);
      out.push_back(std::move(o));
    }
  }
  return out;
}

}  // namespace indexshare::ref::kpool
