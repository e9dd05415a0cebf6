// golden v4 sets from a deepseek_v4 model dump (golden_v4.h: is_v4_dump, load_v4_dump): the dump's
// descriptor, names, dtypes, shapes and values checked, the per-layer inputs read.
#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ref/error.h"
#include "ref/numerics.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/safetensors.h"

namespace indexshare::golden {

using ref::v4::LayerType;

const std::set<std::string>& v4_dump_inputs() {
  static const std::set<std::string> s = {
      "attn.q",          "attn.kv",         "attn.sink",   "compressor.kv", "compressor.gate", "compressor.position_bias",
      "compressor.norm_weight", "indexer.kv", "indexer.gate", "indexer.position_bias", "indexer.norm_weight", "indexer.q",
      "indexer.weights"};
  return s;
}

const std::set<std::string>& v4_dump_outputs() {
  static const std::set<std::string> s = {"compressor.entries", "indexer.entries", "indexer.scores",
                                          "indexer.blocks",     "attn.out",        "attn.out_rotated"};
  return s;
}

bool is_v4_dump(const std::string& file) { return dump_kind(file) == "v4"; }

std::string v4_from_replay(const std::string& file, Impl impl) {
  return "indexshare golden --from " + file + (impl == Impl::ref ? "" : " --impl " + impl_name(impl));
}

namespace {

// The model's inverse frequencies (metadata `key`, a JSON list) must be ref's for the descriptor.
void check_inv_freq(const io::SafetensorsFile& f, const std::string& file, const std::string& key,
                    const ref::v4::RopeParams& rope) {
  const auto it = f.metadata.find(key);
  require(it != f.metadata.end(), file + ": metadata '" + key + "' is missing (the model's RoPE inverse frequencies)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const std::exception&) {
    throw Error(file + ": metadata '" + key + "' is not a JSON list");
  }
  const std::vector<float> want = ref::v4::inv_freq(rope);
  require(j.is_array() && j.size() == want.size(),
          file + ": metadata '" + key + "' must list rope_dim / 2 = " + std::to_string(want.size()) + " numbers");
  for (size_t i = 0; i < want.size(); ++i) {
    require(j[i].is_number(), file + ": metadata '" + key + "'[" + std::to_string(i) + "] is not a number");
    const float got = j[i].get<float>();
    if (got != want[i]) {
      std::ostringstream os;
      os.precision(9);
      os << file << ": metadata '" << key << "'[" << i << "] is " << got << ", but the descriptor's RoPE gives " << want[i]
         << " (theta " << rope.theta << (rope.yarn ? ", YaRN" : "") << "): the model rotates by other angles than the set would";
      throw Error(os.str());
    }
  }
}

template <class T>
Tensor<T> input(const io::SafetensorsFile& f, const std::string& file, const std::string& name, io::DType dtype, const Shape& shape) {
  const io::TensorView* v = f.find(name);
  require(v != nullptr, file + ": tensor '" + name + "' is missing (the layer's type needs it)");
  require(v->dtype == dtype && v->shape == shape, file + ": tensor '" + name + "' is " + io::dtype_name(v->dtype) + " " +
                                                      shape_str(v->shape) + ", expected " + io::dtype_name(dtype) + " " + shape_str(shape));
  Tensor<T> t = io::as_tensor<T>(*v, file);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float x;
    if constexpr (std::is_same_v<T, bf16_t>) x = bf16_to_f32(t[i]);
    else x = t[i];
    if (!std::isfinite(x))
      throw Error(file + ": tensor '" + name + "': element " + shape_str(unflatten(i, t.shape)) + " is " +
                  (std::isnan(x) ? "NaN" : x > 0 ? "+inf" : "-inf") + " (inputs must be finite)");
  }
  return t;
}

// The compressor's and (with indexer inputs) the indexer's inputs of a layer of type in.type, each
// read by f32(name) (the part of the tensor name after "layers.{l}.").
template <class Get>
void fill_compressed_inputs(ref::v4::LayerInputs& in, Get&& f32) {
  if (in.type != LayerType::sliding) {
    in.comp_kv = f32("compressor.kv");
    in.comp_gate = f32("compressor.gate");
    in.comp_bias = f32("compressor.position_bias");
    in.comp_norm = f32("compressor.norm_weight");
  }
  if (in.has_indexer) {
    in.index_kv = f32("indexer.kv");
    in.index_gate = f32("indexer.gate");
    in.index_bias = f32("indexer.position_bias");
    in.index_norm = f32("indexer.norm_weight");
    in.index_q = f32("indexer.q");
    in.index_weights = f32("indexer.weights");
  }
}

// Every tensor name is layers.{l}.{an input or a model output} with l among the descriptor's layers.
void check_names(const io::SafetensorsFile& f, const std::string& file, size_t n_layers) {
  for (const io::TensorView& v : f.tensors) {
    const std::string& n = v.name;
    const size_t dot = n.find('.', 7);
    size_t l = 0;
    bool ok = n.rfind("layers.", 0) == 0 && dot != std::string::npos && dot > 7;
    if (ok) {
      const std::string num = n.substr(7, dot - 7);
      ok = num.find_first_not_of("0123456789") == std::string::npos && (num == "0" || num[0] != '0') && num.size() < 7;
      if (ok) l = std::stoul(num);
    }
    const std::string rest = ok ? n.substr(dot + 1) : "";
    require(ok && (v4_dump_inputs().count(rest) || v4_dump_outputs().count(rest)),
            file + ": tensor '" + n + "' is not a v4 dump name (layers.{l}.{attn.q, attn.kv, attn.sink, compressor.*, indexer.*} "
                   "inputs, or the model's compressor.entries, indexer.{entries,scores,blocks}, attn.{out,out_rotated})");
    require(l < n_layers, file + ": tensor '" + n + "': layer " + std::to_string(l) + " is outside the descriptor's " +
                              std::to_string(n_layers) + " layers (metadata 'problem' types=)");
  }
}

}  // namespace

V4Dump load_v4_dump(const std::string& file) {
  const io::SafetensorsFile f = io::read_safetensors(file);
  const auto p = f.metadata.find("problem");
  require(p != f.metadata.end(), file + ": metadata 'problem' is missing (a v4 dump records its V4 descriptor)");
  V4Dump d;
  try {
    d.spec = parse_v4_spec(p->second);
  } catch (const Error& e) {
    throw Error(file + ": metadata 'problem': " + e.what());
  }
  const ref::v4::Config& c = d.spec.cfg;
  check_inv_freq(f, file, "main_inv_freq", c.main_rope);
  check_inv_freq(f, file, "compress_inv_freq", c.compress_rope);
  const ref::v4::Schedule sch = d.spec.schedule();
  check_names(f, file, sch.types.size());
  using io::DType;
  for (size_t l = 0; l < sch.types.size(); ++l) {
    const LayerType t = sch.types[l];
    const std::string pre = "layers." + std::to_string(l) + ".";
    auto f32 = [&](const std::string& rest) { return input<float>(f, file, pre + rest, DType::F32, v4_tensor_shape(rest, c, t)); };
    ref::v4::LayerInputs in;
    in.type = t;
    in.q = input<bf16_t>(f, file, pre + "attn.q", DType::BF16, {c.n_tokens, c.n_heads, c.head_dim});
    in.kv = input<bf16_t>(f, file, pre + "attn.kv", DType::BF16, {c.n_tokens, 1, c.head_dim});
    in.kv.shape = {c.n_tokens, c.head_dim};
    in.sink = f32("attn.sink");
    in.has_indexer = t == LayerType::csa && sch.full(l);
    fill_compressed_inputs(in, f32);
    d.inputs.push_back(std::move(in));
  }
  return d;
}

ref::OverlapReport v4_overlap(const V4Dump& d, int n_buckets, const ref::Kernels& kern, std::vector<int>& c4a_layers) {
  const ref::v4::Schedule sch = d.spec.schedule();
  const ref::v4::BlockLayers b = ref::v4::block_layers(d.spec.cfg, sch.types, d.inputs, kern);
  c4a_layers = b.layer;
  return ref::v4::block_overlap_report(d.spec.cfg, b, csa_pattern(sch), to_string(d.spec), n_buckets);
}

V4Dump v4_set_inputs(const Loaded& g) {
  V4Dump d;
  d.spec = parse_v4_spec(g.manifest.at("problem").get<std::string>());
  const V4Layout lay = v4_layout(g.manifest);
  d.spec.cfg = lay.cfg;
  const ref::v4::Config& c = d.spec.cfg;
  for (size_t l = 0; l < lay.schedule.types.size(); ++l) {
    const LayerType t = lay.schedule.types[l];
    const std::string pre = "layers." + std::to_string(l) + ".";
    auto f32 = [&](const std::string& n) { return g.tensor<float>(pre + n); };
    ref::v4::LayerInputs in;
    in.type = t;
    in.q = g.tensor<bf16_t>(pre + "attn.q");
    Tensor<bf16_t> kv_full = g.tensor<bf16_t>(pre + "attn.kv");
    in.kv = Tensor<bf16_t>({c.n_tokens, c.head_dim});
    std::copy(kv_full.data.begin(), kv_full.data.begin() + c.n_tokens * c.head_dim, in.kv.data.begin());
    in.sink = f32("attn.sink");
    in.has_indexer = g.find(pre + "indexer.q") != nullptr;
    fill_compressed_inputs(in, f32);
    d.inputs.push_back(std::move(in));
  }
  return d;
}

}  // namespace indexshare::golden
