// indexshare: cross-layer overlap and the greedy IndexCache search on HY V4 layers' top-k.
//
// Every HY V4 layer has a DSA indexer (Full layers run it, Shared ones reuse the most recent Full
// layer's top-k). Each layer with indexer inputs has its own top-k O_l [s_q, index_topk] (run_indexer,
// layer.h) over the keys [0, s_kv); row t's window is causal, [0, s_kv - s_q + t + 1), and rows
// whose window holds no more than index_topk keys pick every key (TRIVIAL, ref/overlap.h).
//
// hyv4_overlap_report: ref::own_selection_report over the layers (ref/overlap.h part 1); the
// dense-attention statistics of Shared layers are not computed.
// hyv4_search: IndexCache's greedy Algorithm 1 (ref/overlap.h part 3), layer 0 Full, every layer
// needing indexer inputs. Loss "output" only: c(j, i) = ||g(O_i) - g(O_j)||_F / ||g(O_j)||_F
// (ref::relative_error), g the layer's gated output (gated_attention: its q, kv, sink, W_uv and
// gate) over layer i's top-k resp. its own; a pattern's loss is the mean of c(j, source(j)).
#pragma once

#include <string>
#include <vector>

#include "ref/hyv4/layer.h"
#include "ref/overlap.h"

namespace indexshare::ref::hyv4 {

// Every layer's own top-k [s_q, index_topk] (empty where the layer has no indexer inputs).
std::vector<Tensor<int32_t>> own_topk(const Config& c, const std::vector<LayerInputs>& in, const Kernels& kern = {});

// The overlap report over the layers (header). pattern: F/S per layer; problem: the report's text.
OverlapReport hyv4_overlap_report(const Config& c, const std::vector<Tensor<int32_t>>& own, const std::string& pattern,
                                  const std::string& problem, int n_buckets = 8);

// The greedy search (header) on the layers' inputs and own = own_topk(c, in). Error naming a layer
// without indexer inputs, a loss other than output, or n_full outside [1, #layers].
SearchResult hyv4_search(const Config& c, const std::vector<LayerInputs>& in, const std::vector<Tensor<int32_t>>& own,
                         const std::string& problem, const SearchOptions& opt);

}  // namespace indexshare::ref::hyv4
