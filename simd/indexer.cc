// indexshare simd/: indexer logits (FP8 and unquantized), bit-identical to ref/indexer.cc.
// The engine and the argument for bit-identity are in simd/indexer-inl.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/indexer.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/indexer-inl.h"

#include <cstring>
#include <limits>

#include "ref/fp4.h"
#include "ref/indexer.h"
#include "simd/common.h"
#include "simd/fp4.h"
#include "simd/simd.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {

// Writes each row's window of logits into out [s_q, s_kv] (pre-filled with -inf).
struct LogitsSink {
  float* out;
  int64_t s_kv;
  bool active(int64_t) const { return true; }
  void operator()(int64_t t, int64_t lo, int64_t hi, const float* vals) const {
    std::memcpy(out + t * s_kv + lo, vals, size_t(hi - lo) * sizeof(float));
  }
};

void IndexerLogits(const detail::IndexerView& v, float* out) {
  LogitsSink sink{out, v.s_kv};
  RunIndexer(v, /*key_block=*/std::numeric_limits<int64_t>::max(), sink);
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(IndexerLogits);

namespace {

template <typename Elem>
Tensor<float> logits(const Tensor<Elem>& q, const Tensor<Elem>& k, const Tensor<float>& k_scale,
                     const Tensor<float>& weights, const Tensor<int32_t>& ks,
                     const Tensor<int32_t>& ke, bool fp8, bool bf16_out = false) {
  ref::check_indexer_inputs(q.shape, k.shape, k_scale, weights, ks, ke);
  detail::IndexerView v;
  v.bf16_out = bf16_out;
  v.q = q.ptr();
  v.k = k.ptr();
  v.fp8 = fp8;
  v.k_scale = k_scale.ptr();
  v.weights = weights.ptr();
  v.ks = ks.ptr();
  v.ke = ke.ptr();
  v.s_q = q.dim(0);
  v.H = q.dim(1);
  v.D = q.dim(2);
  v.s_kv = k.dim(0);
  Tensor<float> out({v.s_q, v.s_kv}, -std::numeric_limits<float>::infinity());
  HWY_DYNAMIC_DISPATCH(IndexerLogits)(v, out.ptr());
  return out;
}

}  // namespace

Tensor<float> indexer_logits_fp8(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  static_assert(sizeof(e4m3_t) == 1);
  return logits(q, k, k_scale, weights, ks, ke, /*fp8=*/true);
}

Tensor<float> indexer_logits_f32(const Tensor<float>& q, const Tensor<float>& k,
                                 const Tensor<float>& k_scale, const Tensor<float>& weights,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke) {
  return logits(q, k, k_scale, weights, ks, ke, /*fp8=*/false);
}

// The FP4 logits are the f32 engine's on the dequantized values (exact in f32) with k_scale 1:
// ref::fp4::logits' order (d ascending in double, heads ascending), rounded once to f32 or bf16.
Tensor<float> fp4_logits(const ref::fp4::Quantized& q, const ref::fp4::Quantized& k, const Tensor<float>& weights,
                         const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, ref::fp4::LogitsType type) {
  ref::fp4::check_logits_inputs(q, k, weights, ks, ke);
  const Tensor<float> qv = ref::fp4::dequantize(q), kv = ref::fp4::dequantize(k);
  return logits(qv, kv, Tensor<float>({kv.dim(0)}, 1.0f), weights, ks, ke, /*fp8=*/false, type == ref::fp4::LogitsType::bf16);
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
