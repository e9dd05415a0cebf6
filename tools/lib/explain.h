// indexshare explain: one query row's path through one layer of a golden set, for a student
// learning DSA or a reviewer looking at one row of a failing kernel.
//
// For row t of layer l the text shows, in the order the layer computes them:
//   row        the row's sequence, its window [ks, ke) of kv rows, top-k and k_eff
//   indexer    the largest logits of the layer that chose the positions (the layer itself when
//              Full, its source layer when Shared), the k-th score, and every position tied with
//              the k-th score marked (selected or not: the tie rule is index ascending)
//   selected   the row's positions (sequence-local, as ranges) and its kv rows
//   shared     for a Shared layer with an indexer of its own: the recall of the layer's own top-k
//              against the positions it reuses (what IndexShare gives up on this row)
//   attention  per head max_logits, lse, the sink factor 1 / (1 + exp(sink - lse)), and for the
//              head asked for the attention weights of the heaviest positions
//   candidate  with a candidate: per tensor it holds for this layer, where it departs on this row
//              and by how much relative to the judge's per-element bound (err / bound > 1 fails)
#pragma once

#include <cstdint>
#include <string>

#include "tools/lib/golden.h"
#include "tools/lib/safetensors.h"

namespace indexshare::explain {

struct Options {
  int layer = 0;
  int64_t row = 0;       // the set's row (for a sampled set its problem row is shown too)
  int64_t head = -1;     // the head whose attention weights are listed; -1: head 0
  int64_t top = 10;      // how many of the largest logits and heaviest weights to list
};

// Error (exit 2) naming the option for a layer, row or head outside the set, or a candidate
// tensor of this layer with a wrong shape or dtype.
std::string explain(const golden::Loaded& g, const Options& o, const io::SafetensorsFile* candidate = nullptr);

}  // namespace indexshare::explain
