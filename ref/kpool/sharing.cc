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
  for (const KpoolLayerInputs& x : in) p.own.push_back(x.has_indexer ? run_kpool_indexer(c, x, kern).sel.pools : Tensor<int32_t>());
  return p;
}

OverlapReport pool_overlap_report(const KpoolConfig& c, const PoolLayers& p, const std::string& pattern, const std::string& problem,
                                  int n_buckets) {
  require(!p.layer.empty(), "overlap: the KPool stack has no DSA layer (no pools to compare)");
  const int64_t n = c.n_pools(), k = std::min(c.index_topk / c.pool, n);
  require(k > 0, "overlap: no complete pool in " + std::to_string(c.s_kv) + " keys (pool " + std::to_string(c.pool) + "): nothing selected");
  return own_selection_report(n, k, visible_pools(c.s_q, c.s_kv, c.pool), p.own, p.layer, pattern, "DSA layer", problem, n_buckets);
}

}  // namespace indexshare::ref::kpool
