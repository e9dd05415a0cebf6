// indexshare diff: the candidate's tensors, dtype conversions and shape checks (errors exit 2).
#include "tools/judge/walk.h"

#include <cstdio>

namespace indexshare::diff {

using namespace detail;

// ---- candidate access: dtype conversions and shape checks (errors exit 2) ----

Tensor<float> candidate_float(const io::SafetensorsFile& c, const std::string& name, const Shape& shape) {
  const io::TensorView& v = c.get(name);
  io::expect_shape(v, shape, c.source);
  if (v.dtype == io::DType::BF16) {
    const Tensor<bf16_t> b = io::as_tensor<bf16_t>(v, c.source);
    Tensor<float> f(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) f[i] = bf16_to_f32(b[i]);
    return f;
  }
  return io::as_tensor<float>(v, c.source);
}

// A candidate's integer positions as int32 (I32, or I64 as many frameworks write them). I64 values
// outside the int32 range are out of range as positions either way: they are judged as the
// nearest int32 bound, and a diagnosis names the first one with its real value (the reports
// below would show the clamped value).
Tensor<int32_t> candidate_int(const io::SafetensorsFile& c, const std::string& name, const Shape& shape,
                              std::vector<std::string>& diagnoses) {
  const io::TensorView& v = c.get(name);
  io::expect_shape(v, shape, c.source);
  if (v.dtype == io::DType::I64) {
    const Tensor<int64_t> w = io::as_tensor<int64_t>(v, c.source);
    Tensor<int32_t> t(w.shape);
    int64_t outside = 0, first = -1;
    for (int64_t i = 0; i < w.numel(); ++i) {
      t[i] = int32_t(std::clamp<int64_t>(w[i], INT32_MIN, INT32_MAX));
      if (t[i] != w[i] && outside++ == 0) first = i;
    }
    if (outside > 0) {
      std::string at;
      for (const int64_t x : cmp::unflatten(first, w.shape)) at += (at.empty() ? "" : ", ") + std::to_string(x);
      diagnoses.push_back(c.source + ": " + name + ": " + std::to_string(outside) +
                          " I64 value(s) outside the int32 range, the first at [" + at + "] = " +
                          std::to_string(w[first]) + " (reported above as the nearest int32 bound)");
    }
    return t;
  }
  return io::as_tensor<int32_t>(v, c.source);
}

std::set<int> own_list_layers(const golden::Loaded& g, const io::SafetensorsFile& c, int n_layers,
                              const std::set<std::string>& outputs, const std::set<std::string>& dump_inputs,
                              const std::string& kind, const std::string& expected,
                              const std::function<std::string(int)>& absent, const std::set<int>& wanted) {
  std::set<int> out;
  const auto fmt = c.metadata.find("format");
  const bool model_dump = fmt != c.metadata.end() && fmt->second == golden::kDumpFormat;
  for (const io::TensorView& v : c.tensors) {
    int l = -1;
    char rest[128] = {0};
    const bool parsed = std::sscanf(v.name.c_str(), "layers.%d.%127s", &l, rest) == 2;
    const bool canonical = parsed && v.name == "layers." + std::to_string(l) + "." + rest;
    if (model_dump && canonical && dump_inputs.count(rest)) continue;  // a model dump's inputs: not judged
    if (!canonical || !outputs.count(rest))
      throw Error(c.source + ": tensor '" + v.name + "' is not a " + kind + " golden output name (expected " + expected + ")");
    if (l < 0 || l >= n_layers)
      throw Error(c.source + ": tensor '" + v.name + "': layer " + std::to_string(l) + " is outside the set's " +
                  std::to_string(n_layers) + " layers");
    if (!g.find(v.name)) throw Error(c.source + ": tensor '" + v.name + "': " + absent(l));
    if (wanted.empty() || wanted.count(l)) out.insert(l);
  }
  for (int l : wanted)
    if (!out.count(l)) throw Error(c.source + ": --layer-list asks for layer " + std::to_string(l) + ", which the candidate does not hold");
  if (out.empty()) throw Error(c.source + ": no " + kind + " golden output names to judge");
  return out;
}

}  // namespace indexshare::diff
