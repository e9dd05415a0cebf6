// simd/stack.cc: the layer stack on the simd kernels: ref::run_stack's loop (ref/stack.cc) on
// simd::kernels(), whose fused streaming indexer + top-k runs when the logits are not kept.
#include "simd/simd.h"

namespace indexshare::simd {

std::vector<ref::StackLayerOutputs> run_stack(const Problem& p, const Schedule& schedule,
                                              const std::vector<ref::LayerInputs>& inputs, bool keep_logits) {
  return ref::run_stack(p, schedule, inputs, keep_logits, kernels());
}

}  // namespace indexshare::simd
