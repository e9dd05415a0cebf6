#include "ref/kpool/sharing.h"

#include <algorithm>

#include "ref/error.h"
#include "ref/kpool/select.h"

namespace indexshare::ref::kpool {

PoolLayers pool_layers(const KpoolConfig& c, const std::vector<int>& dsa, const std::vector<KpoolLayerInputs>& in,
                       const Kernels& kern) {
  require(dsa.size() == in.size(), "kpool overlap: " + std::to_string(in.size()) + " layers' inputs for " +
                                       std::to_string(dsa.size()) + " DSA layers");
  PoolLayers p;
  p.layer = dsa;
  for (const KpoolLayerInputs& x : in) {
    Selection sel;
    if (x.has_indexer) sel = run_kpool_indexer(c, x, kern).sel;
    p.own.push_back(std::move(sel.pools));
    p.lists.push_back(std::move(sel.indices));
  }
  return p;
}

SearchResult pool_search(const KpoolConfig& c, const std::vector<KpoolLayerInputs>& in, const PoolLayers& p, const std::string& problem,
                         const SearchOptions& opt) {
  require(!p.layer.empty(), "search: the KPool stack has no DSA layer (nothing to share)");
  require(in.size() == p.layer.size(), "search: " + std::to_string(in.size()) + " layers' inputs for " + std::to_string(p.layer.size()) +
                                           " DSA layers");
  require(opt.loss == SearchLoss::output, "search: KPool pools are searched with --loss output only, got '" + search_loss_name(opt.loss) + "'");
  for (size_t j = 0; j < p.layer.size(); ++j)
    require(p.lists[j].numel() > 0, "search: DSA layer " + std::to_string(p.layer[j]) +
                                        " has no indexer inputs; every DSA layer needs its own (an all-Full set, a model dump, or a descriptor)");
  const Kernels k = opt.kernels;
  OutputCosts costs(int(p.layer.size()), [&](size_t j, size_t i) { return kpool_attention(c, in[j], p.lists[i], k).out; },
                    "DSA layer");
  return greedy_search(problem, costs, opt);
}

OverlapReport pool_overlap_report(const KpoolConfig& c, const PoolLayers& p, const std::string& pattern, const std::string& problem,
                                  int n_buckets) {
  require(!p.layer.empty(), "overlap: the KPool stack has no DSA layer (no pools to compare)");
  const int64_t n = c.n_pools(), k = std::min(c.index_topk / c.pool, n);
  require(k > 0, "overlap: no complete pool in " + std::to_string(c.s_kv) + " keys (pool " + std::to_string(c.pool) + "): nothing selected");
  return own_selection_report(n, k, visible_pools(c.s_q, c.s_kv, c.pool), p.own, p.layer, pattern, "DSA layer", problem, n_buckets);
}

}  // namespace indexshare::ref::kpool
