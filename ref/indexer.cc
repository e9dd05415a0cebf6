#include "ref/indexer.h"

#include <cmath>
#include <limits>
#include <string>

#include "ref/numerics.h"

namespace indexshare::ref {

void check_indexer_inputs(const Shape& q, const Shape& k, const Tensor<float>& k_scale,
                          const Tensor<float>& weights, const Tensor<int32_t>& ks,
                          const Tensor<int32_t>& ke) {
  require(q.size() == 3, "indexer q: expected rank 3 [s_q, H, D], got " + shape_str(q));
  require(k.size() == 2, "indexer k: expected rank 2 [s_kv, D], got " + shape_str(k));
  const int64_t s_q = q[0], H = q[1], D = q[2], s_kv = k[0];
  require(k[1] == D, "indexer k: head dim " + std::to_string(k[1]) + " differs from q's " +
                         std::to_string(D));
  require(D <= (int64_t(1) << 17), "indexer: head dim above 2^17 breaks exact FP8 dot products");
  require_shape(k_scale, {s_kv}, "indexer k_scale");
  require_shape(weights, {s_q, H}, "indexer weights");
  require_shape(ks, {s_q}, "indexer ks");
  require_shape(ke, {s_q}, "indexer ke");
  for (int64_t t = 0; t < s_q; ++t)
    require(0 <= ks[t] && ks[t] <= ke[t] && ke[t] <= s_kv,
            "indexer ks/ke: row " + std::to_string(t) + " has bounds [" + std::to_string(ks[t]) +
                ", " + std::to_string(ke[t]) + ") outside 0 <= ks <= ke <= s_kv = " +
                std::to_string(s_kv));
}

namespace {

// One implementation for both modes; `Elem` is e4m3_t or float, decoded to double per element.
template <typename Elem, typename Decode>
Tensor<float> logits_impl(const Tensor<Elem>& q, const Tensor<Elem>& k, const Tensor<float>& k_scale,
                          const Tensor<float>& weights, const Tensor<int32_t>& ks,
                          const Tensor<int32_t>& ke, Decode decode) {
  check_indexer_inputs(q.shape, k.shape, k_scale, weights, ks, ke);
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0);
  Tensor<float> out({s_q, s_kv}, -std::numeric_limits<float>::infinity());
  std::vector<double> kd(static_cast<size_t>(s_kv * D)), qd(static_cast<size_t>(H * D));
  for (int64_t i = 0; i < s_kv * D; ++i) kd[size_t(i)] = decode(k[i]);
  for (int64_t t = 0; t < s_q; ++t) {
    for (int64_t i = 0; i < H * D; ++i) qd[size_t(i)] = decode(q[t * H * D + i]);
    for (int64_t s = ks[t]; s < ke[t]; ++s) {
      // Pass 1 and 2: per-head dot product (ascending d), ReLU, weighted head sum (ascending h).
      double acc = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += qd[size_t(h * D + d)] * kd[size_t(s * D + d)];
        const double relu = dot > 0.0 || std::isnan(dot) ? dot : 0.0;  // ReLU keeps NaN, as torch
        const double term = double(weights.at(t, h)) * relu;
        acc = acc + term;
      }
      // Pass 3: the key's scale, then the single rounding to f32.
      out.at(t, s) = float(acc * double(k_scale[s]));
    }
  }
  return out;
}

}  // namespace

Tensor<float> indexer_logits_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  return logits_impl(q, k, k_scale, weights, ks, ke, [](e4m3_t v) { return double(e4m3_to_f32(v)); });
}

Tensor<float> indexer_logits_f32(const Tensor<float>& q, const Tensor<float>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  return logits_impl(q, k, k_scale, weights, ks, ke, [](float v) { return double(v); });
}

}  // namespace indexshare::ref
