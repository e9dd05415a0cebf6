// Test helper: a legitimate tie permutation of a golden set's top-k.
#pragma once

#include <set>

#include "ref/tensor.h"
#include "tools/lib/golden.h"

namespace indexshare::testing {

// Layer 0's top-k with, in every row where one exists, the k-th winner swapped for an unselected
// position of exactly the same golden score (a legitimate tie choice); `swapped` counts the rows.
inline Tensor<int32_t> tie_permuted_topk(const golden::Loaded& g, int& swapped) {
  const Tensor<float> L = g.tensor<float>("layers.0.indexer.logits");
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks"), ke = g.tensor<int32_t>("layers.0.indexer.ke");
  Tensor<int32_t> topk = g.tensor<int32_t>("layers.0.indexer.topk");
  const int64_t k = topk.dim(1);
  swapped = 0;
  for (int64_t t = 0; t < topk.dim(0); ++t) {
    const float kth = L.at(t, ks[t] + topk.at(t, k - 1));
    std::set<int32_t> sel(topk.data.begin() + t * k, topk.data.begin() + (t + 1) * k);
    for (int32_t s = 0; s < ke[t] - ks[t]; ++s)
      if (!sel.count(s) && L.at(t, ks[t] + s) == kth) { topk.at(t, k - 1) = s; ++swapped; break; }
  }
  return topk;
}

}  // namespace indexshare::testing
