#include "ref/stack.h"

#include <optional>
#include <string>

#include "ref/topk.h"

namespace indexshare::ref {

std::vector<LayerInputs> make_stack_inputs(const Problem& p, const Schedule& schedule, const Kernels& k) {
  p.validate();
  return make_stack_inputs(p, schedule, all_rows(p), k);
}

std::vector<LayerInputs> make_stack_inputs(const Problem& p, const Schedule& schedule, std::span<const int64_t> rows,
                                          const Kernels& k) {
  require(schedule.n_layers() == p.n_layers,
          "stack: schedule has " + std::to_string(schedule.n_layers()) + " layers, problem nl" +
              std::to_string(p.n_layers));
  std::vector<LayerInputs> in;
  for (int l = 0; l < schedule.n_layers(); ++l) in.push_back(make_layer_inputs(p, l, schedule.is_full(l) || p.own, rows, k));
  return in;
}

std::vector<StackLayerOutputs> run_stack(const Problem& p, const Schedule& schedule,
                                         const std::vector<LayerInputs>& inputs, bool keep_logits, const Kernels& k) {
  schedule.validate();
  require(int(inputs.size()) == schedule.n_layers(),
          "stack: " + std::to_string(inputs.size()) + " layer inputs for a schedule of " +
              std::to_string(schedule.n_layers()) + " layers");
  std::vector<StackLayerOutputs> out(inputs.size());
  const Tensor<int32_t>* current = nullptr;  // positions of the most recent Full layer
  for (int l = 0; l < schedule.n_layers(); ++l) {
    const LayerInputs& in = inputs[size_t(l)];
    StackLayerOutputs& o = out[size_t(l)];
    o.layer = l;
    o.kind = schedule.kinds[size_t(l)];
    o.source = schedule.source(l);
    // 1. Own indexer, when the layer has one (always for Full layers).
    if (o.kind == LayerKind::full)
      require(in.has_indexer, "stack: Full layer " + std::to_string(l) + " has no indexer inputs");
    if (in.has_indexer) {
      if (!keep_logits) {  // streamed when the kernels can (logits never materialised)
        o.own_topk = layer_topk(p, in, k);
      } else {
        o.logits = layer_logits(p, in, k);
        o.own_topk = k.topk(o.logits, in.ks, in.ke, p.index_topk);
      }
    }
    // 2. The positions the attention uses: fresh for Full, the source's for Shared.
    if (o.kind == LayerKind::full) current = &o.own_topk;
    o.used_topk = *current;
    // 3. The layer's own attention over those positions.
    o.indices = local_to_kv_rows(o.used_topk, in.ks);
    o.attn = layer_attention(p, in, o.indices, k);
  }
  return out;
}

}  // namespace indexshare::ref
