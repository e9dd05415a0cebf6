#include "ref/kpool/sharing.h"

#include <algorithm>
#include <map>

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

namespace {

// The DSA layers' costs c(j, i) (sharing.h): attention outputs over own and borrowed union lists.
class PoolCosts : public LayerCosts {
 public:
  PoolCosts(const KpoolConfig& c, const std::vector<KpoolLayerInputs>& in, const PoolLayers& p, const Kernels& k)
      : c_(c), in_(in), p_(p), k_(k) {
    for (size_t j = 0; j < p.layer.size(); ++j) own_out_.push_back(out(j, j));
  }
  int n_layers() const override { return int(p_.layer.size()); }
  SearchLoss loss() const override { return SearchLoss::output; }
  double layer_cost(int layer, int source) override {
    require(0 <= source && source <= layer && layer < n_layers(),
            "search: layer cost needs 0 <= source <= layer < #DSA, got " + std::to_string(layer) + ", " + std::to_string(source));
    if (source == layer) return 0.0;
    const auto key = std::make_pair(layer, source);
    if (const auto it = cache_.find(key); it != cache_.end()) return it->second;
    return cache_[key] = relative_error(out(size_t(layer), size_t(source)), own_out_[size_t(layer)]);
  }

 private:
  Tensor<float> out(size_t j, size_t i) const { return kpool_attention(c_, in_[j], p_.lists[i], k_).out; }
  const KpoolConfig& c_;
  const std::vector<KpoolLayerInputs>& in_;
  const PoolLayers& p_;
  Kernels k_;
  std::vector<Tensor<float>> own_out_;
  std::map<std::pair<int, int>, double> cache_;
};

}  // namespace

SearchResult pool_search(const KpoolConfig& c, const std::vector<KpoolLayerInputs>& in, const PoolLayers& p, const std::string& problem,
                         const SearchOptions& opt) {
  require(!p.layer.empty(), "search: the KPool stack has no DSA layer (nothing to share)");
  require(in.size() == p.layer.size(), "search: " + std::to_string(in.size()) + " layers' inputs for " + std::to_string(p.layer.size()) +
                                           " DSA layers");
  require(opt.loss == SearchLoss::output, "search: KPool pools are searched with --loss output only, got '" + search_loss_name(opt.loss) + "'");
  for (size_t j = 0; j < p.layer.size(); ++j)
    require(p.lists[j].numel() > 0, "search: DSA layer " + std::to_string(p.layer[j]) +
                                        " has no indexer inputs; every DSA layer needs its own (an all-Full set, a model dump, or a descriptor)");
  PoolCosts costs(c, in, p, opt.kernels);
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
