#include "ref/v4/sharing.h"

#include <map>

#include "ref/error.h"

namespace indexshare::ref::v4 {

namespace {

// k = min(index_topk, n_b): the width of every C4A layer's blocks.
int64_t block_width(const Config& cfg) { return std::min(cfg.index_topk, cfg.n_tokens / cfg.csa_ratio); }

}  // namespace

BlockLayers block_layers(const Config& cfg, const std::vector<LayerType>& types, const std::vector<LayerInputs>& in,
                         const Kernels& kern) {
  require(types.size() == in.size(), "v4 block_layers: " + std::to_string(in.size()) + " layer inputs for " +
                                         std::to_string(types.size()) + " layer types");
  BlockLayers b;
  for (size_t l = 0; l < types.size(); ++l) {
    if (types[l] != LayerType::csa) continue;
    const LayerInputs& li = in[l];
    b.layer.push_back(int(l));
    b.entries.push_back(kern.v4_compress(li.comp_kv, li.comp_gate, li.comp_bias, li.comp_norm, compressor_params(cfg, types[l])));
    Tensor<int32_t> own;
    if (li.has_indexer) {
      const Tensor<float> k = kern.v4_compress(li.index_kv, li.index_gate, li.index_bias, li.index_norm, indexer_compressor_params(cfg));
      own = select_blocks(index_scores(li.index_q, k, li.index_weights, cfg.csa_ratio, cfg.rotation, kern), cfg.csa_ratio,
                          cfg.index_topk, kern);
    }
    b.own.push_back(std::move(own));
  }
  return b;
}

OverlapReport block_overlap_report(const Config& cfg, const BlockLayers& b, const std::string& pattern,
                                   const std::string& problem, int n_buckets) {
  require(!b.layer.empty(), "overlap: the V4 stack has no C4A layer (no block indices to compare)");
  const int64_t T = cfg.n_tokens, n_b = T / cfg.csa_ratio;
  return own_selection_report(n_b, block_width(cfg), causal_block_end(T, cfg.csa_ratio, n_b), b.own, b.layer, pattern, "C4A layer",
                              problem, n_buckets);
}

SearchResult block_search(const Config& cfg, const std::vector<LayerInputs>& in, const BlockLayers& b,
                          const std::string& problem, const SearchOptions& opt) {
  require(!b.layer.empty(), "search: the V4 stack has no C4A layer (nothing to share)");
  require(opt.loss == SearchLoss::output, "search: V4 block indices are searched with --loss output only, got '" +
                                              search_loss_name(opt.loss) + "'");
  for (size_t j = 0; j < b.layer.size(); ++j)
    require(b.own[j].numel() > 0, "search: C4A layer " + std::to_string(b.layer[j]) +
                                      " has no indexer inputs; every C4A layer needs its own (a set of all Full C4A layers, or a model dump)");
  const Kernels k = opt.kernels;
  OutputCosts costs(int(b.layer.size()), [&](size_t j, size_t i) {  // C4A rank j's attention output over rank i's blocks
    const LayerInputs& li = in[size_t(b.layer[j])];
    LayerOutputs o;
    attend(cfg, LayerType::csa, li.q, li.kv, li.sink, b.entries[j], &b.own[i], o, k);
    return std::move(o.attn.out);
  }, "C4A layer");
  return greedy_search(problem, costs, opt);
}

}  // namespace indexshare::ref::v4
