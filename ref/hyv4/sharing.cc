#include "ref/hyv4/sharing.h"

#include "ref/error.h"

namespace indexshare::ref::hyv4 {

std::vector<Tensor<int32_t>> own_topk(const Config& c, const std::vector<LayerInputs>& in, const Kernels& kern) {
  std::vector<Tensor<int32_t>> own;
  for (const LayerInputs& x : in)
    own.push_back(x.has_indexer ? run_indexer(x.q, x.k, x.k_norm_w, x.k_norm_b, x.weights, indexer_params(c), kern).indices
                                : Tensor<int32_t>());
  return own;
}

OverlapReport hyv4_overlap_report(const Config& c, const std::vector<Tensor<int32_t>>& own, const std::string& pattern,
                                  const std::string& problem, int n_buckets) {
  require(!own.empty(), "overlap: the HY V4 stack has no layer");
  Tensor<int32_t> ke({c.s_q});
  for (int64_t t = 0; t < c.s_q; ++t) ke[t] = int32_t(c.s_kv - c.s_q + t + 1);
  std::vector<int> layer(own.size());
  for (size_t l = 0; l < own.size(); ++l) layer[l] = int(l);
  return own_selection_report(c.s_kv, c.index_topk, ke, own, layer, pattern, "layer", problem, n_buckets);
}

SearchResult hyv4_search(const Config& c, const std::vector<LayerInputs>& in, const std::vector<Tensor<int32_t>>& own,
                         const std::string& problem, const SearchOptions& opt) {
  require(!own.empty() && in.size() == own.size(), "search: the HY V4 stack has no layer, or its inputs and top-k differ in count");
  require(opt.loss == SearchLoss::output, "search: HY V4 layers are searched with --loss output only, got '" + search_loss_name(opt.loss) + "'");
  for (size_t l = 0; l < own.size(); ++l)
    require(own[l].numel() > 0, "search: layer " + std::to_string(l) +
                                    " has no indexer inputs; every layer needs its own (an all-Full set, or a dump of an all-Full model)");
  const Kernels k = opt.kernels;
  OutputCosts costs(int(own.size()), [&](size_t j, size_t i) {  // layer j's gated output over layer i's top-k
    const LayerInputs& x = in[j];
    return gated_attention(x.attn_q, x.attn_kv, own[i], x.sink, c.sm_scale, c.kv_lora, &x.w_uv, x.gate, k).gated;
  }, "layer");
  return greedy_search(problem, costs, opt);
}

}  // namespace indexshare::ref::hyv4
