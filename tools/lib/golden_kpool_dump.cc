// golden kpool sets from a glm5_next model dump (golden_kpool.h: is_kpool_dump, load_kpool_dump): the
// dump's descriptor, names, dtypes, shapes and values checked, the per-DSA-layer inputs read.
#include <algorithm>
#include <cmath>

#include "ref/error.h"
#include "ref/kpool/sharing.h"
#include "ref/numerics.h"
#include "tools/lib/golden/internal.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/safetensors.h"

namespace indexshare::golden {

const std::set<std::string>& kpool_dump_inputs() {
  static const std::set<std::string> s = {"indexer.q", "indexer.k", "indexer.gate", "indexer.ape", "indexer.weights",
                                          "attn.q",    "attn.kv"};
  return s;
}

const std::set<std::string>& kpool_outputs() {
  static const std::set<std::string> s = {"indexer.pool_logits", "indexer.pool_keys", "indexer.scores",  "indexer.pools",
                                          "indexer.history",     "indexer.tail",      "indexer.indices", "attn.indices",
                                          "attn.out",            "attn.lse",          "attn.max_logits", "indexer.pool_keys_fp8"};
  return s;
}

bool is_kpool_dump(const std::string& file) { return dump_kind(file) == "kpool"; }


KpoolDump load_kpool_dump(const std::string& file) {
  const io::SafetensorsFile f = io::read_safetensors(file);
  const auto p = f.metadata.find("problem");
  require(p != f.metadata.end(), file + ": metadata 'problem' is missing (the model's kpool descriptor)");
  KpoolDump d;
  try {
    d.spec = parse_kpool_spec(p->second);
  } catch (const Error& e) {
    throw Error(file + ": metadata 'problem': " + e.what());
  }
  require(d.spec.fp8 == "none", file + ": metadata 'problem': fp8=" + d.spec.fp8 + ": a model dump holds no FP8 cache pages");
  const ref::kpool::KpoolConfig& c = d.spec.cfg;
  const std::vector<int> dsa = d.spec.dsa_layers();
  for (const io::TensorView& v : f.tensors) {  // layers.{l}.{an input or a model output}, l a DSA layer
    int64_t l = -1;
    std::string rest;
    const bool named = detail::split_layer_name(v.name, l, rest) && (kpool_dump_inputs().count(rest) || kpool_outputs().count(rest));
    require(named, file + ": tensor '" + v.name + "' is not a kpool dump name (layers.{l}.NAME; golden_kpool.h)");
    require(std::find(dsa.begin(), dsa.end(), int(l)) != dsa.end(),
            file + ": tensor '" + v.name + "': layer " + std::to_string(l) + " is not a DSA layer of the descriptor");
  }
  using io::DType;
  for (size_t i = 0; i < dsa.size(); ++i) {
    const std::string pre = "layers." + std::to_string(dsa[i]) + ".";
    ref::kpool::KpoolLayerInputs in;
    in.has_indexer = d.spec.pattern[i] == 'F';
    if (in.has_indexer) {
      in.q = detail::dumped_values(f, file, pre + "indexer.q", {DType::F32}, {c.s_q, c.heads, c.dim});
      in.k = detail::dumped_values(f, file, pre + "indexer.k", {DType::F32}, {c.s_kv, c.dim});
      in.g = detail::dumped_values(f, file, pre + "indexer.gate", {DType::F32}, {c.s_kv, c.dim});
      in.ape = detail::dumped_values(f, file, pre + "indexer.ape", {DType::F32}, {c.pool, c.dim});
      in.weights = detail::dumped_values(f, file, pre + "indexer.weights", {DType::F32}, {c.s_q, c.heads});
    } else {
      for (const char* n : {"indexer.q", "indexer.k", "indexer.gate", "indexer.ape", "indexer.weights"})
        require(!f.find(pre + n), file + ": tensor '" + pre + n + "': layer " + std::to_string(dsa[i]) +
                                      " is a Shared DSA layer (no indexer of its own)");
    }
    in.attn_q = detail::to_bf16_tensor(detail::dumped_values(f, file, pre + "attn.q", {DType::BF16}, {c.s_q, c.h_q, c.d_qk}));
    in.attn_kv = detail::to_bf16_tensor(detail::dumped_values(f, file, pre + "attn.kv", {DType::BF16}, {c.s_kv, 1, c.d_qk}));
    d.inputs.push_back(std::move(in));
  }
  return d;
}

KpoolDump kpool_set_inputs(const Loaded& g) {
  KpoolDump d;
  d.spec = parse_kpool_spec(g.manifest.at("problem").get<std::string>());
  const std::vector<int> dsa = d.spec.dsa_layers();
  for (size_t i = 0; i < dsa.size(); ++i) {
    const std::string pre = "layers." + std::to_string(dsa[i]) + ".";
    ref::kpool::KpoolLayerInputs in;
    in.has_indexer = d.spec.pattern[i] == 'F';
    if (in.has_indexer) {
      in.q = g.tensor<float>(pre + "indexer.q");
      in.k = g.tensor<float>(pre + "indexer.k");
      in.g = g.tensor<float>(pre + "indexer.gate");
      in.ape = g.tensor<float>(pre + "indexer.ape");
      in.weights = g.tensor<float>(pre + "indexer.weights");
    }
    in.attn_q = g.tensor<bf16_t>(pre + "attn.q");
    in.attn_kv = g.tensor<bf16_t>(pre + "attn.kv");
    d.inputs.push_back(std::move(in));
  }
  return d;
}

ref::OverlapReport kpool_overlap(const KpoolDump& d, int n_buckets, const ref::Kernels& kern, std::vector<int>& dsa_layers) {
  const ref::kpool::PoolLayers p = ref::kpool::pool_layers(d.spec.cfg, d.spec.dsa_layers(), d.inputs, kern);
  dsa_layers = p.layer;
  return ref::kpool::pool_overlap_report(d.spec.cfg, p, d.spec.pattern, to_string(d.spec), n_buckets);
}

}  // namespace indexshare::golden
