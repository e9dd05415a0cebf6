// indexshare: the table of kernels a computation runs, so that the layer, the stack, the toy
// model and the tools have one code path for ref/ and simd/. Kernels{} holds ref's functions;
// simd::kernels() (simd/simd.h) holds the simd ones, each of which returns ref's bits, so no
// result depends on the choice. The functions that take a table (layer_logits, layer_attention,
// run_stack, indexer_module_logits, forward, the overlap evaluators) default to Kernels{}.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/bounds.h"
#include "ref/indexer.h"
#include "ref/kpool/pool.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/tensor.h"
#include "ref/topk.h"
#include "ref/train/attention_bwd.h"
#include "ref/train/indexer_loss.h"
#include "ref/v4/compressor.h"

namespace indexshare::ref {

struct Kernels {
  LinearFn linear = ref::linear;
  HeadLinearFn head_linear = ref::head_linear;  // MLA's absorbed einsums
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
  AttentionOut (*dense_attention)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, float, int64_t, const Tensor<int32_t>&,
                                  const Tensor<int32_t>&, const Tensor<float>*) = ref::dense_attention;
  // The sparse attention backward (ref/train/attention_bwd.h); simd's returns ref's bits.
  AttentionBackwardOut (*sparse_attention_backward)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, const Tensor<int32_t>&,
                                                    float, int64_t, const Tensor<bf16_t>&, const Tensor<int32_t>*,
                                                    const Tensor<float>*) = ref::sparse_attention_backward;
  // Its per-element bounds of dq and dkv (cmp::attention_backward_bounds), which the judge reads;
  // simd's returns ref's bits.
  cmp::AttentionBackwardBounds (*attention_backward_bounds)(const Tensor<bf16_t>&, const Tensor<bf16_t>&,
                                                            const Tensor<int32_t>&, float, int64_t, const Tensor<bf16_t>&,
                                                            const Tensor<int32_t>*, const AttentionBackwardOut&,
                                                            bool) = cmp::attention_backward_bounds;
  // Optional fused, streaming FP8 indexer + top-k (the result of topk(logits_fp8(...))) that
  // run_stack uses when the logits are not kept; null: the logits are materialised.
  Tensor<int32_t> (*fused_topk_fp8)(const Tensor<e4m3_t>&, const Tensor<e4m3_t>&, const Tensor<float>&,
                                    const Tensor<float>&, const Tensor<int32_t>&, const Tensor<int32_t>&,
                                    int64_t) = nullptr;
  // The oracle's own computations (ref/bounds.h): the low-precision emulation behind the
  // FlashAttention-style budget, the per-element attention bounds and the indexer logits rule.
  // simd's return ref's bits (the budget is written into golden manifests).
  AttentionOut (*emulate_attention_lowp)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, const Tensor<int32_t>&, float,
                                         int64_t, const Tensor<int32_t>*, const Tensor<float>*) =
      cmp::emulate_attention_lowp;
  cmp::AttentionBounds (*attention_bounds)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, const Tensor<int32_t>&, float,
                                           int64_t, const Tensor<int32_t>*, const AttentionOut&) = cmp::attention_bounds;
  cmp::AttentionBounds (*attention_bounds_sm)(const Tensor<bf16_t>&, const Tensor<bf16_t>&, const Tensor<int32_t>&, float,
                                              int64_t, const Tensor<int32_t>*, const Tensor<float>*,
                                              const AttentionOut&, const cmp::BoundsKv*) = cmp::attention_bounds_sm;
  // The bounds' shared work on one kv (d_qk columns) for several attention_bounds_sm calls
  // (cmp::BoundsKv); null: none (ref's).
  std::unique_ptr<cmp::BoundsKv> (*prepare_bounds_kv)(const Tensor<bf16_t>&, int64_t) = nullptr;
  cmp::FloatRule (*indexer_logits_rule)(const Tensor<e4m3_t>&, const Tensor<e4m3_t>&, const Tensor<float>&,
                                        const Tensor<float>&, const Tensor<float>&) = cmp::indexer_logits_rule;
  // The generator's fills (ref/rng.h), which make the generated inputs (make_layer_inputs): simd's
  // run several chunks' streams in vector lanes and return the same values.
  void (*fill_range)(float*, int64_t, int64_t, Dist, float, uint64_t, uint64_t) = indexshare::fill_range;
  void (*fill_range_bf16)(bf16_t*, int64_t, int64_t, Dist, float, uint64_t, uint64_t) = indexshare::fill_range_bf16;
  // The FP8 quantization of the generated indexer q and k (ref/numerics.h): simd's in lanes, the same bytes.
  void (*quantize_rows)(const float*, int64_t, int64_t, int, ScaleRule, e4m3_t*, float*, const std::string&) =
      indexshare::quantize_rows;
  // The indexer's distillation loss and its gradients (ref/train/indexer_loss.h); simd's: the same bits.
  train::IndexerLossOut (*indexer_loss)(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                        const Tensor<int32_t>&, const Tensor<int32_t>&, const Tensor<int32_t>*,
                                        const std::vector<train::TeacherLayer>&, const train::IndexerLossOptions&) =
      train::indexer_loss;
  // DeepSeek-V4's compressor (ref/v4/compressor.h): simd's runs the windows in parallel, the same bits.
  Tensor<float> (*v4_compress)(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                               const v4::CompressorParams&) = v4::compress;
  // GLM-5.3's pooled indexer keys (ref/kpool/pool.h): simd's in double lanes, the same bits.
  Tensor<float> (*kpool_pool_keys)(const Tensor<float>&, const Tensor<float>&, kpool::PoolRounding) =
      kpool::pool_keys;
};

}  // namespace indexshare::ref
