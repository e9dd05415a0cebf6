// indexshare: a stack of DSA layers with cross-layer index sharing, at kernel level.
//
// For each layer l, in order, within one forward pass:
//   Full   : logits_l = indexer(l); topk_l = topk(logits_l); current <- topk_l
//   Shared : no indexer is needed; the layer uses `current`, the top-k positions of the most
//            recent Full layer (its `source`). When the Shared layer nevertheless has indexer
//            inputs (Problem::own), its own would-be top-k is computed too, for overlap
//            statistics, and is NEVER used for attention.
//   then   : indices_l = local_to_kv_rows(used positions, ks); attn_l = the layer's own sparse
//            attention (its own q, kv and sink) over those indices.
// Only integer positions cross layers: each layer keeps its own inputs, attention and outputs.
// Positions are sequence-local, so a Shared layer applies them to its own kv rows exactly as
// its source layer did.
//
// Prefill chunks and decode: the problem's s_q query rows are the last s_q positions of a
// sequence of s_kv keys (start position s_kv - s_q), so a chunked prefill is a sequence of
// problems with growing s_kv, and decode with next_n query tokens is s_q = next_n: row t sees
// keys k <= s_kv - next_n + t (the DeepGEMM paged-decode rule), its own key included.
#pragma once

#include <vector>

#include "ref/layer.h"
#include "ref/schedule.h"

namespace indexshare::ref {

struct StackLayerOutputs {
  int layer = 0;
  LayerKind kind = LayerKind::full;
  int source = 0;                // the Full layer whose positions this layer used (itself if Full)
  Tensor<float> logits;          // own indexer logits [s_q, s_kv] (empty without indexer inputs
                                 // or when logits are not kept)
  Tensor<int32_t> own_topk;      // own top-k [s_q, topk]: Full: the positions used; Shared with
                                 // indexer inputs: would-be positions, unused; else empty
  Tensor<int32_t> used_topk;     // [s_q, topk] the positions the attention used (= source's)
  Tensor<int32_t> indices;       // [s_q, 1, topk] kv rows the attention used
  AttentionOut attn;
};

// Inputs of every layer of p's stack: Full layers always have indexer inputs; Shared layers have
// them iff p.own.
std::vector<LayerInputs> make_stack_inputs(const Problem& p, const Schedule& schedule, const Kernels& k = {});
// The same for the sampled query rows `rows` (ref/layer.h). run_stack runs unchanged on them: ks/ke
// carry each row's window, so every output row equals the full stack's row rows[r] bit for bit.
std::vector<LayerInputs> make_stack_inputs(const Problem& p, const Schedule& schedule, std::span<const int64_t> rows,
                                          const Kernels& k = {});

// Runs the stack. keep_logits = false drops each layer's [s_q, s_kv] logits after its top-k.
std::vector<StackLayerOutputs> run_stack(const Problem& p, const Schedule& schedule,
                                         const std::vector<LayerInputs>& inputs, bool keep_logits = true,
                                         const Kernels& k = {});

}  // namespace indexshare::ref
