// indexshare: cross-layer overlap and the greedy IndexCache search on DeepSeek-V4 block indices.
//
// Only C4A layers have an indexer, and V4's Full/Shared rule counts only them (stack.h): here the
// "layers" are the C4A layers of a stack, renumbered by their rank j = 0, 1, ... (their model layer
// numbers kept in BlockLayers::layer). Each C4A layer with indexer inputs has its own blocks
// O_j [T, k] (k = min(index_topk, n_b); select_blocks of its indexer, indexer.h). Row t's valid
// length is its number of causal blocks ke[t] = min(floor((t + 1) / m), n_b): rows with ke[t] <= k
// pick every causal block and are TRIVIAL, left out as in ref/overlap.h.
//
// Overlap (block_overlap_report): ref::overlap_report's statistics (ref/overlap.h part 1: per-row
// overlap |A ∩ B| / k and Jaccard, adjacent pairs, the all-pairs matrix, query-position buckets)
// over the C4A ranks, with s_q = T query rows and the blocks as keys. Its `pattern` is the C4A
// layers' F/S pattern; the dense-attention statistics of Shared layers (part 2) are not computed.
//
// Search (block_search): IndexCache's greedy Algorithm 1 (ref/overlap.h part 3) over the C4A ranks
// (rank 0 stays Full: a pattern starts with F), every C4A layer needing indexer inputs. Loss
// "output" only: c(j, i) = ||out(U) - out(O)||_F / ||out(O)||_F (ref::relative_error), out the
// layer's f32 attention output (layer.h attend: window + T + each block, one softmax with the
// sink, then the inverse RoPE) over the blocks U = O_i of C4A rank i resp. its own O = O_j; the
// loss of a pattern is the mean of c(j, source(j)) over the C4A layers (Full ones add 0).
#pragma once

#include <string>
#include <vector>

#include "ref/overlap.h"
#include "ref/v4/stack.h"

namespace indexshare::ref::v4 {

// The C4A layers of a stack: `layer` their model layer numbers (rank order), `own` their own
// blocks [T, k] (empty where the layer has no indexer inputs), `entries` their compressor entries.
struct BlockLayers {
  std::vector<int> layer;
  std::vector<Tensor<int32_t>> own;
  std::vector<Tensor<float>> entries;
};
// From every layer's inputs (types in schedule order): the compressors and indexers run with kern.
BlockLayers block_layers(const Config& cfg, const std::vector<LayerType>& types, const std::vector<LayerInputs>& in,
                         const Kernels& kern = {});

// The overlap report over the C4A ranks (header). pattern: F/S per C4A layer (the schedule's);
// problem: the report's descriptor text. A Full C4A layer without own blocks is an Error.
OverlapReport block_overlap_report(const Config& cfg, const BlockLayers& b, const std::string& pattern,
                                   const std::string& problem, int n_buckets = 8);

// The greedy search over the C4A ranks (header): in the stack's inputs (every C4A layer with
// indexer inputs), b = block_layers(cfg, types, in). Error naming the layer otherwise, or a loss
// other than output, or n_full outside [1, #C4A].
SearchResult block_search(const Config& cfg, const std::vector<LayerInputs>& in, const BlockLayers& b,
                          const std::string& problem, const SearchOptions& opt);

}  // namespace indexshare::ref::v4
