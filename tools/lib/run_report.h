// run's report: one line per layer of a stack (`run` prints it; bench's run stage computes it as
// `run` does, so that the commands' timings hold the same work).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ref/stack.h"
#include "ref/tensor.h"

namespace indexshare::run_report {

// |A ∩ B| / |A| of each row of two [rows, k] position tensors, their valid entries (>= 0) taken as
// sets; 1 where A has none. Rows in parallel, each its own output.
std::vector<double> recall_rows(const Tensor<int32_t>& a, const Tensor<int32_t>& b);
// A layer's line from its folds: the per-row recalls summed in row order; the output's sum of
// squares and its fingerprint, each in kFoldLanes lanes by element number mod kFoldLanes (element
// order within a lane, so the loop runs the lanes side by side): the sum is the lanes' sums added
// in lane order, the fingerprint FNV-1a over the lanes' FNV-1a hashes of their f32 words (bit
// patterns; equal fingerprints mean equal bytes). Element numbers count across add_out calls, so
// ranks folded in row order print one process's line.
constexpr int kFoldLanes = 8;
struct LayerFold {
  double recall_sum = 0;
  int64_t rows = 0, numel = 0;
  double ss_lane[kFoldLanes] = {};
  uint64_t fp_lane[kFoldLanes] = {0xCBF29CE484222325ull, 0xCBF29CE484222325ull, 0xCBF29CE484222325ull, 0xCBF29CE484222325ull,
                                  0xCBF29CE484222325ull, 0xCBF29CE484222325ull, 0xCBF29CE484222325ull, 0xCBF29CE484222325ull};
  void add_recalls(std::span<const double> r);
  void add_out(std::span<const float> out);
  double ss() const;
  uint64_t fp() const;
};
std::string layer_line(int l, bool full, int source, bool has_own, const LayerFold& f);
// One process's line of a layer: its own top-k against the positions it used (no recall when
// either is empty), and its out.
std::string layer_line(int l, bool full, int source, const Tensor<int32_t>& own, const Tensor<int32_t>& used,
                       const Tensor<float>& out);
// The same for a stack layer.
std::string stack_layer_line(const ref::StackLayerOutputs& o);

}  // namespace indexshare::run_report
