// golden hyv4 sets from a hy_v4 model dump (golden_hyv4.h: is_hyv4_dump, load_hyv4_dump): the
// dump's descriptor, names, dtypes, shapes and values checked, the per-layer inputs read.
#include <cmath>

#include "ref/error.h"
#include "ref/numerics.h"
#include "tools/lib/golden/internal.h"
#include "tools/lib/golden_hyv4.h"
#include "tools/lib/safetensors.h"

namespace indexshare::golden {

const std::set<std::string>& hyv4_dump_inputs() {
  static const std::set<std::string> s = {"indexer.q", "indexer.k", "indexer.k_norm_w", "indexer.k_norm_b", "indexer.weights_raw",
                                          "attn.q",    "attn.kv",   "attn.sink",        "attn.w_uv",        "attn.gate"};
  return s;
}

const std::set<std::string>& hyv4_outputs() {
  static const std::set<std::string> s = {"indexer.k_norm", "indexer.q_rope", "indexer.k_rope", "indexer.weights",
                                          "indexer.scores", "indexer.topk",   "attn.indices",   "attn.out",
                                          "attn.lse",       "attn.max_logits", "attn.o_v",      "attn.gated"};
  return s;
}

bool is_hyv4_dump(const std::string& file) { return dump_kind(file) == "hyv4"; }


Hyv4Dump load_hyv4_dump(const std::string& file) {
  const io::SafetensorsFile f = io::read_safetensors(file);
  const auto p = f.metadata.find("problem");
  require(p != f.metadata.end(), file + ": metadata 'problem' is missing (the dumped layers' hyv4 descriptor)");
  Hyv4Dump d;
  try {
    d.spec = parse_hyv4_spec(p->second);
  } catch (const Error& e) {
    throw Error(file + ": metadata 'problem': " + e.what());
  }
  const ref::hyv4::Config& c = d.spec.cfg;
  const Schedule sch = d.spec.problem.schedule();
  for (const io::TensorView& v : f.tensors) {  // layers.{l}.{an input or a model output}, l among the descriptor's
    int64_t l = -1;
    std::string rest;
    const bool named = detail::split_layer_name(v.name, l, rest);
    require(named && l < sch.n_layers() && (hyv4_dump_inputs().count(rest) || hyv4_outputs().count(rest)),
            file + ": tensor '" + v.name + "' is not a hyv4 dump name (layers.{l}.NAME, l < " + std::to_string(sch.n_layers()) +
                "; golden_hyv4.h)");
  }
  using io::DType;
  for (int l = 0; l < sch.n_layers(); ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ref::hyv4::LayerInputs in;
    in.has_indexer = sch.is_full(l);
    if (in.has_indexer) {
      in.q = detail::dumped_values(f, file, pre + "indexer.q", {DType::F32, DType::BF16}, {c.s_q, c.heads, c.dim});
      in.k = detail::dumped_values(f, file, pre + "indexer.k", {DType::F32, DType::BF16}, {c.s_kv, c.dim});
      in.k_norm_w = detail::dumped_values(f, file, pre + "indexer.k_norm_w", {DType::F32}, {c.dim});
      in.k_norm_b = detail::dumped_values(f, file, pre + "indexer.k_norm_b", {DType::F32}, {c.dim});
      in.weights = detail::dumped_values(f, file, pre + "indexer.weights_raw", {DType::F32}, {c.s_q, c.heads});
    }
    in.attn_q = detail::to_bf16_tensor(detail::dumped_values(f, file, pre + "attn.q", {DType::BF16}, {c.s_q, c.h_q, c.d_qk()}));
    in.attn_kv = detail::to_bf16_tensor(detail::dumped_values(f, file, pre + "attn.kv", {DType::BF16}, {c.s_kv, 1, c.d_qk()}));
    if (c.sink) in.sink = detail::dumped_values(f, file, pre + "attn.sink", {DType::F32}, {c.h_q});
    in.w_uv = detail::dumped_values(f, file, pre + "attn.w_uv", {DType::BF16}, {c.h_q, c.v_dim, c.kv_lora});
    in.gate = detail::dumped_values(f, file, pre + "attn.gate", {DType::BF16}, {c.s_q, c.h_q, c.v_dim});
    d.inputs.push_back(std::move(in));
  }
  return d;
}

Hyv4Dump hyv4_set_inputs(const Loaded& g) {
  Hyv4Dump d;
  d.spec = parse_hyv4_spec(g.manifest.at("problem").get<std::string>());
  const Schedule sch = d.spec.problem.schedule();
  auto f32 = [&](const std::string& n) {  // F32, or BF16 widened (a set stores bf16-exact values as BF16)
    if (g.get(n).dtype == io::DType::F32) return g.tensor<float>(n);
    const Tensor<bf16_t> b = g.tensor<bf16_t>(n);
    Tensor<float> t(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) t[i] = bf16_to_f32(b[i]);
    return t;
  };
  for (int l = 0; l < sch.n_layers(); ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ref::hyv4::LayerInputs in;
    in.has_indexer = sch.is_full(l);
    if (in.has_indexer) {
      in.q = f32(pre + "indexer.q");
      in.k = f32(pre + "indexer.k");
      in.k_norm_w = f32(pre + "indexer.k_norm_w");
      in.k_norm_b = f32(pre + "indexer.k_norm_b");
      in.weights = f32(pre + "indexer.weights_raw");
    }
    in.attn_q = g.tensor<bf16_t>(pre + "attn.q");
    in.attn_kv = g.tensor<bf16_t>(pre + "attn.kv");
    if (d.spec.cfg.sink) in.sink = f32(pre + "attn.sink");
    in.w_uv = f32(pre + "attn.w_uv");
    in.gate = f32(pre + "attn.gate");
    d.inputs.push_back(std::move(in));
  }
  return d;
}

}  // namespace indexshare::golden
