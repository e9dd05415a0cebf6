// indexshare: named generated tensors drawn through a kernel table's fills (ref/rng.h streams), the
// inputs of the kernel-level layers (ref/kpool/layer.h, ref/hyv4/layer.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "ref/kernels.h"
#include "ref/rng.h"
#include "ref/tensor.h"

namespace indexshare::ref {

// Positions [first, first + shape[0]) of the stream stream_tag(name), each row shape[1..] values of
// `dist` times `scale`, by k's fill: a row's values do not depend on which rows are drawn with it, so
// a decode step reads the bytes of the same rows of the whole prefill.
inline Tensor<float> draw_rows(const Kernels& k, Dist dist, uint64_t seed, const std::string& name, Shape shape,
                               int64_t first, float scale = 1.0f) {
  Tensor<float> t(std::move(shape));
  const int64_t row_len = t.shape[0] > 0 ? t.numel() / t.shape[0] : 0;
  k.fill_range(t.ptr(), first * row_len, t.numel(), dist, scale, seed, stream_tag(name));
  return t;
}

// The same rows as bf16 (fill_range_bf16: f32_to_bf16 of draw_rows' values with scale 1).
inline Tensor<bf16_t> draw_rows_bf16(const Kernels& k, Dist dist, uint64_t seed, const std::string& name, Shape shape,
                                     int64_t first) {
  Tensor<bf16_t> t(std::move(shape));
  const int64_t row_len = t.shape[0] > 0 ? t.numel() / t.shape[0] : 0;
  k.fill_range_bf16(t.ptr(), first * row_len, t.numel(), dist, 1.0f, seed, stream_tag(name));
  return t;
}

}  // namespace indexshare::ref
