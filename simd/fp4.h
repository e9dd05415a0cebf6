// indexshare simd/: the FP4 indexer's logits (ref/fp4.h), bit-identical to ref::fp4::logits on every
// target and thread count: the FP8 / f32 logits engine (simd/indexer-inl.h) on the dequantized values,
// which are exact in f32, with k_scale 1 and the final rounding to f32 or bf16 from double.
// Quantization stays ref::fp4::quantize (one pass over the inputs, a small share of the time).
#pragma once

#include "ref/fp4.h"
#include "ref/tensor.h"

namespace indexshare::simd {

Tensor<float> fp4_logits(const ref::fp4::Quantized& q, const ref::fp4::Quantized& k, const Tensor<float>& weights,
                         const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                         ref::fp4::LogitsType type = ref::fp4::LogitsType::f32);

}  // namespace indexshare::simd
