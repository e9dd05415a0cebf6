// indexshare._core, Hunyuan HY V4's bindings (ref/hyv4/layer.h): the indexer on the caller's tensors,
// the gated attention with its unscaled sink, and one generated layer. Registered by NB_MODULE in
// tools/python/_core.cc.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "ref/hyv4/layer.h"
#include "ref/rng.h"
#include "tools/lib/impl.h"
#include "tools/python/core.h"

using namespace indexshare;

namespace indexshare::core {

namespace {
void put_indexer(nb::dict& d, ref::hyv4::IndexerOutputs&& o) {
  d["k_norm"] = to_numpy<float>(std::move(o.k_norm));
  d["q_rope"] = to_numpy<float>(std::move(o.q_rope));
  d["k_rope"] = to_numpy<float>(std::move(o.k_rope));
  d["weights"] = to_numpy<float>(std::move(o.weights));
  d["scores"] = to_numpy<float>(std::move(o.scores));
  d["indices"] = to_numpy<int32_t>(std::move(o.indices));
}

void put_attention(nb::dict& d, ref::hyv4::AttentionOutputs&& o) {
  d["out"] = to_numpy<float>(std::move(o.attn.out));
  d["max_logits"] = to_numpy<float>(std::move(o.attn.max_logits));
  d["lse"] = to_numpy<float>(std::move(o.attn.lse));
  d["o_v"] = to_numpy<float>(std::move(o.o_v));
  d["gated"] = to_numpy<float>(std::move(o.gated));
  d["gated_bf16"] = to_numpy<uint16_t>(std::move(o.gated_bf16));
}
}  // namespace

void bind_hyv4(nb::module_& m) {
  // The indexer: q [s_q, H, D] before RoPE, k [s_kv, D] before the LayerNorm, the LayerNorm's weight and
  // bias [D], weights_proj's output [s_q, H]; the query rows are the last s_q of s_kv positions.
  m.def("hyv4_indexer", [](In<float> q, In<float> k, In<float> k_norm_w, In<float> k_norm_b, In<float> weights_raw,
                           int64_t index_topk, int64_t rope, double theta, const std::string& slice, float eps,
                           Impl impl) {
    const auto tq = borrow<float>(q), tk = borrow<float>(k), tw = borrow<float>(k_norm_w);
    const auto tb = borrow<float>(k_norm_b), tr = borrow<float>(weights_raw);
    ref::hyv4::IndexerParams p;
    p.rope = rope, p.theta = theta, p.slice = ref::hyv4::parse_rope_slice(slice), p.eps = eps;
    p.index_topk = index_topk;
    auto o = timed([&] { return ref::hyv4::run_indexer(tq, tk, tw, tb, tr, p, kernels_for(impl)); });
    nb::dict d;
    put_indexer(d, std::move(o));
    return d;
  }, nb::arg("q"), nb::arg("k"), nb::arg("k_norm_w"), nb::arg("k_norm_b"), nb::arg("weights_raw"),
     nb::arg("index_topk"), nb::arg("rope") = 64, nb::arg("theta") = 10000.0, nb::arg("slice") = "trailing",
     nb::arg("eps") = 1e-5f, nb::arg("impl") = Impl::ref);

  // The gated attention: q bf16 [s_q, h_q, d_qk], kv bf16 [s_kv, 1, d_qk], indices [s_q, topk], sink [h_q]
  // (an unscaled logit), w_uv [h_q, v, d_v] or None (then v = d_v), gate [s_q, h_q, v].
  m.def("hyv4_attention", [](In<uint16_t> q, In<uint16_t> kv, In<int32_t> indices, In<float> sink, float sm_scale,
                             int64_t d_v, std::optional<In<float>> w_uv, In<float> gate, Impl impl) {
    const auto tq = borrow<bf16_t>(q), tkv = borrow<bf16_t>(kv);
    const auto ti = borrow<int32_t>(indices);
    const auto ts = borrow<float>(sink), tg = borrow<float>(gate);
    const auto tw = borrow_optional<float>(w_uv);
    auto o = timed([&] {
      return ref::hyv4::gated_attention(tq, tkv, ti, ts, sm_scale, d_v, tw ? &tw->get() : nullptr, tg,
                                        kernels_for(impl));
    });
    nb::dict d;
    put_attention(d, std::move(o));
    return d;
  }, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sink"), nb::arg("sm_scale"), nb::arg("d_v"),
     nb::arg("w_uv").none(), nb::arg("gate"), nb::arg("impl") = Impl::ref);

  // One generated layer (ref/hyv4/layer.h; the defaults are its Config's).
  m.def("hyv4_layer", [](int64_t s_q, int64_t s_kv, int64_t heads, int64_t dim, int64_t rope, int64_t index_topk,
                         int64_t h_q, int64_t kv_lora, int64_t attn_rope, int64_t v_dim, float sm_scale, uint64_t seed,
                         const std::string& dist, int layer, Impl impl) {
    ref::hyv4::Config c;
    c.s_q = s_q, c.s_kv = s_kv, c.heads = heads, c.dim = dim, c.rope = rope, c.index_topk = index_topk;
    c.h_q = h_q, c.kv_lora = kv_lora, c.attn_rope = attn_rope, c.v_dim = v_dim, c.sm_scale = sm_scale;
    c.seed = seed, c.dist = parse_dist(dist);
    const ref::Kernels kern = kernels_for(impl);
    ref::hyv4::LayerInputs in = ref::hyv4::make_layer_inputs(c, layer, true, kern);
    ref::hyv4::LayerOutputs o = timed([&] { return ref::hyv4::run_layer(c, in, layer, kern); });
    nb::dict d;
    d["q"] = to_numpy<float>(std::move(in.q));
    d["k"] = to_numpy<float>(std::move(in.k));
    d["k_norm_w"] = to_numpy<float>(std::move(in.k_norm_w));
    d["k_norm_b"] = to_numpy<float>(std::move(in.k_norm_b));
    d["weights_raw"] = to_numpy<float>(std::move(in.weights));
    d["attn_q"] = to_numpy<uint16_t>(std::move(in.attn_q));
    d["attn_kv"] = to_numpy<uint16_t>(std::move(in.attn_kv));
    d["w_uv"] = to_numpy<float>(std::move(in.w_uv));
    d["gate"] = to_numpy<float>(std::move(in.gate));
    d["sink"] = to_numpy<float>(std::move(in.sink));
    put_indexer(d, std::move(*o.indexer));
    put_attention(d, std::move(o.attn));
    return d;
  }, nb::arg("s_q"), nb::arg("s_kv"), nb::arg("heads") = 4, nb::arg("dim") = 32, nb::arg("rope") = 16,
     nb::arg("index_topk") = 8, nb::arg("h_q") = 2, nb::arg("kv_lora") = 64, nb::arg("attn_rope") = 16,
     nb::arg("v_dim") = 32, nb::arg("sm_scale") = 0.0625f, nb::arg("seed") = 1, nb::arg("dist") = "normal",
     nb::arg("layer") = 0, nb::arg("impl") = Impl::ref);
}

}  // namespace indexshare::core
