// indexshare: the table of kernels a computation runs, so that the toy model and the tools have
// one code path for ref/ and simd/. Kernels{} holds ref's functions; simd::kernels()
// (simd/simd.h) holds the simd ones, each of which returns ref's bits, so no result depends on
// the choice.
#pragma once

#include <cstdint>
#include <vector>

#include "ref/attention.h"
#include "ref/indexer.h"
#include "ref/layer.h"
#include "ref/module_ops.h"
#include "ref/schedule.h"
#include "ref/stack.h"
#include "ref/tensor.h"
#include "ref/topk.h"

namespace indexshare::ref {

struct Kernels {
  LinearFn linear = ref::linear;
  Tensor<float> (*logits_fp8)(const Tensor<e4m3_t>&, const Tensor<e4m3_t>&, const Tensor<float>&,
                              const Tensor<float>&, const Tensor<int32_t>&, const Tensor<int32_t>&) =
      indexer_logits_fp8;
  Tensor<float> (*logits_f32)(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                              const Tensor<float>&, const Tensor<int32_t>&, const Tensor<int32_t>&) =
      indexer_logits_f32;
  Tensor<int32_t> (*topk)(const Tensor<float>&, const Tensor<int32_t>&, const Tensor<int32_t>&, int64_t) =
      ref::topk;
  AttentionOut (*sparse_attention)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, const Tensor<int32_t>&, float,
                                   int64_t, const Tensor<int32_t>*, const Tensor<float>*) = ref::sparse_attention;
  std::vector<StackLayerOutputs> (*run_stack)(const Problem&, const Schedule&, const std::vector<LayerInputs>&,
                                              bool) = ref::run_stack;
};

}  // namespace indexshare::ref
