// indexshare._core, the module-level bindings (ref/module.h, ref/module_ops.h, ref/numerics.h): the
// norms, RoPE, Hadamard, linear and FP8 quantization steps (bind_module_ops), then the indexer and
// MLA steps of a layer (bind_module_steps). Registered by NB_MODULE in tools/python/_core.cc.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ref/config.h"
#include "ref/error.h"
#include "ref/module.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "simd/simd.h"
#include "tools/lib/impl.h"
#include "tools/python/core.h"

using namespace indexshare;

namespace indexshare::core {

namespace {


// ---- module level (ref/module.h, ref/module_ops.h, ref/numerics.h) ----
// Weights are copied into the ref:: weight structs (they own Tensors); activations are borrowed.

Tensor<float> copy_of(const In<float>& a) { return Tensor<float>(borrow<float>(a).get()); }

// In the order of the structs' fields (ref/module.h): wq_b, wk, k_norm_w, k_norm_b, weights_proj.
ref::IndexerWeights indexer_weights_of(const std::vector<In<float>>& w) {
  require(w.size() == 5, "indexer weights: expected 5 tensors, got " + std::to_string(w.size()));
  ref::IndexerWeights iw;
  iw.wq_b = copy_of(w[0]); iw.wk = copy_of(w[1]); iw.k_norm_w = copy_of(w[2]); iw.k_norm_b = copy_of(w[3]);
  iw.weights_proj = copy_of(w[4]);
  return iw;
}

// wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo.
ref::MlaWeights mla_weights_of(const std::vector<In<float>>& w) {
  require(w.size() == 7, "MLA weights: expected 7 tensors, got " + std::to_string(w.size()));
  ref::MlaWeights mw;
  mw.wq_a = copy_of(w[0]); mw.q_norm = copy_of(w[1]); mw.wq_b = copy_of(w[2]); mw.wkv_a = copy_of(w[3]);
  mw.kv_norm = copy_of(w[4]); mw.wkv_b = copy_of(w[5]); mw.wo = copy_of(w[6]);
  return mw;
}

// A vector as a rank-1 tensor (moved, no copy).
Tensor<float> vector_tensor(std::vector<float> v) {
  Tensor<float> t;
  t.shape = {int64_t(v.size())};
  t.data = std::move(v);
  return t;
}

ModelConfig config_of(const std::string& model) {
  ModelConfig cfg = model_preset(model);
  cfg.validate();
  return cfg;
}

// x viewed as [rows, n] (n = its last dim; rows = the product of the others; rank >= 1).
std::pair<int64_t, int64_t> rows_cols(const Tensor<float>& x, const std::string& what) {
  require(x.rank() >= 1, what + ": expected rank >= 1, got a scalar");
  const int64_t n = x.dim(x.rank() - 1);
  return {n == 0 ? 0 : x.numel() / n, n};
}

// An optional per-feature vector of length n (LayerNorm / RMSNorm weight or bias): nullptr if absent.
const float* vector_of(const std::optional<BorrowedTensor<float>>& v, int64_t n, const std::string& what) {
  if (!v) return nullptr;
  require_shape(v->get(), Shape{n}, what);
  return v->get().ptr();
}

}  // namespace

void bind_module_ops(nb::module_& m) {
  // ---- module level: the indexer and MLA steps (ref/module.h, ref/module_ops.h, ref/numerics.h) ----
  m.def("model_config", [](const std::string& model) {
    const ModelConfig c = config_of(model);
    nb::dict d;
    d["name"] = c.name; d["n_layers"] = c.n_layers; d["dim"] = c.dim; d["n_heads"] = c.n_heads;
    d["q_lora_rank"] = c.q_lora_rank; d["kv_lora_rank"] = c.kv_lora_rank; d["qk_nope_head_dim"] = c.qk_nope_head_dim;
    d["qk_rope_head_dim"] = c.qk_rope_head_dim; d["v_head_dim"] = c.v_head_dim; d["index_n_heads"] = c.index_n_heads;
    d["index_head_dim"] = c.index_head_dim; d["index_topk"] = c.index_topk;
    d["indexer_rope"] = ref::rope_layout_name(c.indexer_rope); d["index_scale_rule"] = scale_rule_name(c.index_scale_rule);
    d["rope_theta"] = c.rope_theta; d["yarn"] = c.yarn; d["rms_eps"] = c.rms_eps; d["index_norm_eps"] = c.index_norm_eps;
    d["d_qk"] = c.d_qk(); d["d_v"] = c.d_v(); d["softmax_scale"] = c.softmax_scale(); d["seq"] = c.seq;
    return d;
  });
  m.def("model_rope_inv_freq", [](const std::string& model) {
    return to_numpy<float>(vector_tensor(config_of(model).rope_inv_freq()));
  });
  m.def("rope_inv_freq", [](int rope_dim, double theta) {
    return to_numpy<float>(vector_tensor(ref::rope_inv_freq(rope_dim, theta)));
  });
  // x [S, M, rope_dim] f32: row (t, m) rotated for position pos[t] (ref::apply_rope), into a copy.
  m.def("apply_rope", [](In<float> x, In<int64_t> pos, In<float> inv_freq, const std::string& layout) {
    const auto tx = borrow<float>(x);
    const auto tp = borrow<int64_t>(pos);
    const auto tf = borrow<float>(inv_freq);
    const ref::RopeLayout l = ref::parse_rope_layout(layout);
    require(tx.get().rank() == 3, "x: expected rank 3 [S, M, rope_dim]");
    const int64_t S = tx.get().dim(0), M = tx.get().dim(1), R = tx.get().dim(2);
    require_shape(tp.get(), Shape{S}, "positions");
    require_shape(tf.get(), Shape{R / 2}, "inv_freq");
    require(R <= INT32_MAX, "x: rope_dim too large");
    const std::vector<float> freq(tf.get().data.begin(), tf.get().data.end());
    Tensor<float> out(tx.get());
    {
      nb::gil_scoped_release release;
      for (int64_t t = 0; t < S; ++t) {
        require(tp.get()[t] >= 0, "positions: expected >= 0, got " + std::to_string(tp.get()[t]) + " at row " + std::to_string(t));
        for (int64_t j = 0; j < M; ++j) ref::apply_rope(out.ptr() + (t * M + j) * R, int(R), tp.get()[t], freq, l);
      }
    }
    return to_numpy<float>(std::move(out));
  });
  m.def("hadamard_transform", [](In<float> x) {
    const auto tx = borrow<float>(x);
    const auto [rows, n] = rows_cols(tx.get(), "x");
    require(n <= INT32_MAX, "x: last dim too large");
    Tensor<float> out(tx.get());
    {
      nb::gil_scoped_release release;
      for (int64_t r = 0; r < rows; ++r) ref::hadamard_transform(out.ptr() + r * n, int(n));
    }
    return to_numpy<float>(std::move(out));
  });
  m.def("layer_norm", [](In<float> x, std::optional<In<float>> weight, std::optional<In<float>> bias, float eps) {
    const auto tx = borrow<float>(x);
    const auto tw = borrow_optional<float>(weight), tb = borrow_optional<float>(bias);
    const auto [rows, n] = rows_cols(tx.get(), "x");
    const float* w = vector_of(tw, n, "weight");
    const float* b = vector_of(tb, n, "bias");
    require(std::isfinite(eps) && eps >= 0, "eps: expected finite and >= 0");
    Tensor<float> out(tx.get().shape);
    {
      nb::gil_scoped_release release;
      for (int64_t r = 0; r < rows; ++r) ref::layer_norm(tx.get().ptr() + r * n, out.ptr() + r * n, n, w, b, eps);
    }
    return to_numpy<float>(std::move(out));
  }, nb::arg("x"), nb::arg("weight").none(), nb::arg("bias").none(), nb::arg("eps"));
  m.def("rms_norm", [](In<float> x, std::optional<In<float>> weight, float eps) {
    const auto tx = borrow<float>(x);
    const auto tw = borrow_optional<float>(weight);
    const auto [rows, n] = rows_cols(tx.get(), "x");
    const float* w = vector_of(tw, n, "weight");
    require(std::isfinite(eps) && eps >= 0, "eps: expected finite and >= 0");
    Tensor<float> out(tx.get().shape);
    {
      nb::gil_scoped_release release;
      for (int64_t r = 0; r < rows; ++r) ref::rms_norm(tx.get().ptr() + r * n, out.ptr() + r * n, n, w, eps);
    }
    return to_numpy<float>(std::move(out));
  }, nb::arg("x"), nb::arg("weight").none(), nb::arg("eps"));
  m.def("linear", [](In<float> x, In<float> w, bool bf16, Impl impl) {
    const auto tx = borrow<float>(x), tw = borrow<float>(w);
    note_inputs(&tx.get(), &tw.get());
    auto r = timed([&] {
      Tensor<float> y = kernels_for(impl).linear(tx, tw);
      if (bf16) ref::round_bf16_inplace(y);
      return y;
    });
    return to_numpy<float>(std::move(r));
  });
  m.def("quantize", [](In<float> x, int block, const std::string& rule) {
    const auto tx = borrow<float>(x);
    const ScaleRule r = parse_scale_rule(rule);
    require(block >= 1, "block: expected >= 1, got " + std::to_string(block));
    Quantized q;
    {
      nb::gil_scoped_release release;
      q = quantize(tx, block, r, "x");
    }
    return nb::make_tuple(to_numpy<uint8_t>(std::move(q.codes)), to_numpy<float>(std::move(q.scales)));
  });
  m.def("dequantize", [](In<uint8_t> codes, In<float> scales, int block) {
    require(block >= 1, "block: expected >= 1, got " + std::to_string(block));
    Quantized q;
    q.codes = Tensor<e4m3_t>(borrow<e4m3_t>(codes).get());
    q.scales = Tensor<float>(borrow<float>(scales).get());
    Tensor<float> out;
    {
      nb::gil_scoped_release release;
      out = dequantize(q, block);
    }
    return to_numpy<float>(std::move(out));
  });
}

void bind_module_steps(nb::module_& m) {
  m.def("indexer_module", [](const std::string& model, const std::vector<In<float>>& w, In<float> x, In<float> qr,
                             int64_t start_pos, const std::string& variant, Impl impl) {
    const ModelConfig cfg = config_of(model);
    const ref::IndexerWeights iw = indexer_weights_of(w);
    const auto tx = borrow<float>(x), tq = borrow<float>(qr);
    const ref::IndexerVariant v = ref::parse_indexer_variant(variant);
    require(start_pos >= 0, "start_pos: expected >= 0, got " + std::to_string(start_pos));
    note_inputs(&tx.get(), &tq.get());
    ref::IndexerModuleOut o = timed([&] {
      return ref::indexer_module(cfg, iw, tx, tq, start_pos, v, kernels_for(impl).linear);
    });
    nb::dict d;
    const std::pair<const char*, Tensor<float>*> f32s[] = {
        {"q_proj", &o.q_proj}, {"q_rope", &o.q_rope}, {"q_hadamard", &o.q_hadamard}, {"k_proj", &o.k_proj},
        {"k_norm", &o.k_norm}, {"k_rope", &o.k_rope}, {"k_hadamard", &o.k_hadamard}, {"q_scale", &o.q_scale},
        {"k_scale", &o.k_scale}, {"weights", &o.weights}, {"q", &o.q}, {"k", &o.k}};
    for (const auto& [name, t] : f32s)
      if (t->numel()) d[name] = to_numpy<float>(std::move(*t));
    if (o.q8.numel()) d["q8"] = to_numpy<uint8_t>(std::move(o.q8));
    if (o.k8.numel()) d["k8"] = to_numpy<uint8_t>(std::move(o.k8));
    return d;
  });
  m.def("mla_query", [](const std::string& model, const std::vector<In<float>>& w, In<float> x, int64_t start_pos, Impl impl) {
    const ModelConfig cfg = config_of(model);
    const ref::MlaWeights mw = mla_weights_of(w);
    const auto tx = borrow<float>(x);
    require(start_pos >= 0, "start_pos: expected >= 0, got " + std::to_string(start_pos));
    note_inputs(&tx.get());
    const ref::Kernels kern = kernels_for(impl);
    ref::MlaQuery q = timed([&] { return ref::mla_query(cfg, mw, tx, start_pos, kern.linear, kern.head_linear); });
    return nb::make_tuple(to_numpy<float>(std::move(q.qr)), to_numpy<float>(std::move(q.q_nope)),
                          to_numpy<uint16_t>(std::move(q.q)));
  });
  m.def("mla_kv", [](const std::string& model, const std::vector<In<float>>& w, In<float> x, int64_t start_pos,
                     bool fp8_roundtrip, Impl impl) {
    const ModelConfig cfg = config_of(model);
    const ref::MlaWeights mw = mla_weights_of(w);
    const auto tx = borrow<float>(x);
    require(start_pos >= 0, "start_pos: expected >= 0, got " + std::to_string(start_pos));
    note_inputs(&tx.get());
    auto r = timed([&] { return ref::mla_kv(cfg, mw, tx, start_pos, fp8_roundtrip, kernels_for(impl).linear); });
    return to_numpy<uint16_t>(std::move(r));
  });
  m.def("mla_value_up", [](const std::string& model, const std::vector<In<float>>& w, In<float> o_lat, Impl impl) {
    const ModelConfig cfg = config_of(model);
    const ref::MlaWeights mw = mla_weights_of(w);
    const auto to = borrow<float>(o_lat);
    note_inputs(&to.get());
    auto r = timed([&] { return ref::mla_value_up(cfg, mw, to, kernels_for(impl).head_linear); });
    return to_numpy<float>(std::move(r));
  });
  m.def("mla_output", [](const std::string& model, const std::vector<In<float>>& w, In<float> o_lat, Impl impl) {
    const ModelConfig cfg = config_of(model);
    const ref::MlaWeights mw = mla_weights_of(w);
    const auto to = borrow<float>(o_lat);
    note_inputs(&to.get());
    const ref::Kernels kern = kernels_for(impl);
    auto r = timed([&] { return ref::mla_output(cfg, mw, to, kern.linear, kern.head_linear); });
    return to_numpy<float>(std::move(r));
  });
}

}  // namespace indexshare::core
