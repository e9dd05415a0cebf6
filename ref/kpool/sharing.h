// indexshare: cross-layer overlap of GLM-5.3's pool selections (IndexCache's statistics over the
// DSA layers of a KPool stack).
//
// The layers are the stack's DSA layers in order, renumbered by their rank j = 0, 1, ... (their
// model layer numbers kept in PoolLayers::layer). Each DSA layer with indexer inputs has its own
// pools O_j [s_q, select_k] (select_tokens' pools of its pooled indexer, select.h): the keys are
// the complete pools [0, n_pools), row t's window its visible pools ke[t] (visible_pools), and rows
// with ke[t] <= select_k pick every visible pool (TRIVIAL, left out as in ref/overlap.h). The tail
// is the same for every layer (it depends on the query position only) and is not compared.
//
// pool_overlap_report: ref::own_selection_report over the DSA ranks (ref/overlap.h part 1: per-row
// overlap and Jaccard, adjacent pairs, the all-pairs matrix, query-position buckets); the
// dense-attention statistics of Shared layers are not computed.
//
// pool_search: IndexCache's greedy Algorithm 1 (ref/overlap.h part 3) over the DSA ranks (rank 0
// stays Full), every DSA layer needing indexer inputs. Loss "output" only: c(j, i) =
// ||out(L_i) - out(L_j)||_F / ||out(L_j)||_F (ref::relative_error), out the layer's attention
// (kpool_attention, ref's sparse attention over its own q and kv) over DSA rank i's union list L_i
// (pools expanded, tail included) resp. its own; a pattern's loss is the mean of c(j, source(j)).
#pragma once

#include <string>
#include <vector>

#include "ref/kpool/layer.h"
#include "ref/overlap.h"

namespace indexshare::ref::kpool {

struct PoolLayers {
  std::vector<int> layer;             // the DSA layers' model layer numbers, in order
  std::vector<Tensor<int32_t>> own;   // their own pools [s_q, select_k] (empty without indexer inputs)
  std::vector<Tensor<int32_t>> lists; // their union lists [s_q, width] (history | tail | -1; likewise)
};
// From the DSA layers' inputs (in[j] of model layer dsa[j]): each pooled indexer run with kern.
PoolLayers pool_layers(const KpoolConfig& c, const std::vector<int>& dsa, const std::vector<KpoolLayerInputs>& in,
                       const Kernels& kern = {});

// The overlap report over the DSA ranks (header). pattern: F/S per DSA layer; problem: the report's
// descriptor text. A Full DSA layer without own pools is an Error naming it.
OverlapReport pool_overlap_report(const KpoolConfig& c, const PoolLayers& p, const std::string& pattern, const std::string& problem,
                                  int n_buckets = 8);

// The greedy search (header) on the DSA layers' inputs `in` (in[j] of rank j) and p = pool_layers(...).
// Error naming the layer without indexer inputs, a loss other than output, or n_full outside [1, #DSA].
SearchResult pool_search(const KpoolConfig& c, const std::vector<KpoolLayerInputs>& in, const PoolLayers& p, const std::string& problem,
                         const SearchOptions& opt);

}  // namespace indexshare::ref::kpool
