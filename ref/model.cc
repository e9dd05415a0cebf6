#include "ref/model.h"

#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/topk.h"

namespace indexshare::ref {

ToyModel make_toy_model(const ModelConfig& cfg, const Schedule& schedule, uint64_t seed, float similarity,
                        IndexerVariant variant, bool own_indexer_on_shared, bool fp8_kv_roundtrip) {
  cfg.validate();
  require(schedule.n_layers() == cfg.n_layers, "toy model: schedule has " + std::to_string(schedule.n_layers()) +
                                                   " layers, config " + std::to_string(cfg.n_layers));
  ToyModel m{cfg, schedule, variant, fp8_kv_roundtrip, {}};
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ToyLayer layer;
    layer.has_indexer = schedule.is_full(l) || own_indexer_on_shared;
    if (layer.has_indexer) layer.indexer = random_indexer_weights(cfg, seed, pre, similarity, "model.");
    layer.mla = random_mla_weights(cfg, seed, pre, similarity, "model.");
    // attn_norm = bf16(1 + 0.1 * noise), like the other norm weights.
    layer.attn_norm = Tensor<float>({cfg.dim});
    fill(layer.attn_norm.ptr(), cfg.dim, Dist::normal, 0.1f, seed, stream_tag(pre + "attn_norm"));
    for (float& v : layer.attn_norm.data) v = round_bf16(1.0f + v);
    m.layers.push_back(std::move(layer));
  }
  return m;
}

Tensor<float> toy_hidden(const ModelConfig& cfg, uint64_t seed, int64_t start, int64_t S) {
  // Row r is drawn from its own stream "hidden.{start + r}", so any split into chunks gives the
  // same rows.
  Tensor<float> h({S, cfg.dim});
  for (int64_t r = 0; r < S; ++r) {
    fill(h.ptr() + r * cfg.dim, cfg.dim, Dist::normal, 1.0f, seed, stream_tag("hidden." + std::to_string(start + r)));
    for (int64_t c = 0; c < cfg.dim; ++c) h[r * cfg.dim + c] = round_bf16(h[r * cfg.dim + c]);
  }
  return h;
}

ToyForward forward(const ToyModel& m, ToyCache& cache, const Tensor<float>& h_in, const Kernels& k) {
  const ModelConfig& cfg = m.cfg;
  require(h_in.rank() == 2 && h_in.dim(1) == cfg.dim, "toy forward h: expected [S, dim=" + std::to_string(cfg.dim) +
                                                          "], got " + shape_str(h_in.shape));
  const int64_t S = h_in.dim(0), start = cache.len, L = int64_t(m.layers.size());
  if (cache.kv.empty()) {
    cache.kv.resize(size_t(L));
    cache.index_keys.resize(size_t(L));
  }
  // Causal windows over the cache including this chunk.
  Tensor<int32_t> ks({S}, 0), ke({S});
  for (int64_t t = 0; t < S; ++t) ke[t] = int32_t(start + t + 1);

  ToyForward f;
  f.layers.resize(size_t(L));
  Tensor<float> h = h_in;
  const Tensor<int32_t>* current = nullptr;
  for (int64_t l = 0; l < L; ++l) {
    const ToyLayer& layer = m.layers[size_t(l)];
    ToyLayerTrace& tr = f.layers[size_t(l)];
    // 1. Normed input, MLA query and this chunk's latent KV rows, appended to the cache.
    tr.x = Tensor<float>(h.shape);
    for (int64_t r = 0; r < S; ++r)
      rms_norm(h.ptr() + r * cfg.dim, tr.x.ptr() + r * cfg.dim, cfg.dim, layer.attn_norm.ptr(), cfg.rms_eps);
    round_bf16_inplace(tr.x);
    const MlaQuery mq = mla_query(cfg, layer.mla, tr.x, start, k.linear, k.head_linear);
    tr.q = mq.q;
    tr.qr = mq.qr;
    cache.kv[size_t(l)] =
        concat_rows(cache.kv[size_t(l)], mla_kv(cfg, layer.mla, tr.x, start, m.fp8_kv_roundtrip, k.linear));
    // 2. Own indexer (Full layers, and Shared layers that carry one): keys cached, logits, top-k.
    if (layer.has_indexer) {
      tr.indexer = indexer_module(cfg, layer.indexer, tr.x, mq.qr, start, m.variant, k.linear);
      cache.index_keys[size_t(l)] = concat_keys(cache.index_keys[size_t(l)], indexer_keys(tr.indexer));
      tr.logits = indexer_module_logits(tr.indexer, cache.index_keys[size_t(l)], m.variant, ks, ke, k);
      tr.own_topk = k.topk(tr.logits, ks, ke, cfg.index_topk);
    }
    require(!m.schedule.is_full(int(l)) || layer.has_indexer, "toy model: Full layer " + std::to_string(l) + " has no indexer");
    // 3. Positions: fresh for Full layers, the most recent Full layer's for Shared ones.
    if (m.schedule.is_full(int(l))) current = &tr.own_topk;
    tr.used_topk = *current;
    // 4. Sparse attention over this layer's own cache, output projection, residual.
    tr.attn = k.sparse_attention(tr.q, cache.kv[size_t(l)], local_to_kv_rows(tr.used_topk, ks),
                                 float(cfg.softmax_scale()), cfg.d_v(), nullptr, nullptr);
    tr.out = mla_output(cfg, layer.mla, tr.attn.out, k.linear, k.head_linear);
    for (int64_t i = 0; i < h.numel(); ++i) h[i] = round_bf16(h[i] + tr.out[i]);
  }
  cache.len += S;
  f.h_out = std::move(h);
  return f;
}

}  // namespace indexshare::ref
