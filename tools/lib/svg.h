// indexshare: renderers of the overlap report and the greedy search (ref/overlap.h): a
// fixed-width text table, JSON (nlohmann), CSV, and hand-written SVG figures.
//
// SVG: every figure is a standalone, well-formed SVG 1.1 document (XML declaration, the svg
// namespace, width/height and a viewBox, a <title>), with all text XML-escaped, white
// background, and no external resources, so it opens as is in a browser.
//   overlap_heatmap_svg       the n_layers x n_layers matrix of mean own-top-k overlap
//                             (or Jaccard), colour scale [vmin, vmax] (viridis) with a legend;
//                             both axes carry the layer index and an F/S strip coloured per kind
//                             (Full red, Shared blue); each Full layer's group (itself and the
//                             Shared layers that use its positions) is outlined on the diagonal;
//                             entries without data (no own top-k) are grey. Cells carry a
//                             tooltip with their value.
//   overlap_by_position_svg   adjacent-layer overlap vs query position (the report's buckets):
//                             the mean over all adjacent pairs (pooled rows) with its p10-p90
//                             band, plus one thin line per adjacent pair when there are at most
//                             12 pairs; empty buckets (only trivial rows) break the lines.
//   search_loss_svg           the greedy search loss after each step (step 0 = all Full), each
//                             point labelled with the layer flipped to Shared.
//
// Numbers: JSON carries doubles as is (NaN and infinities become null); CSV and tables print
// "nan" / "inf". The percentile rule is nearest-rank (ref/overlap.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "ref/overlap.h"

namespace indexshare::io {

// & < > " ' replaced by their entities.
std::string xml_escape(const std::string& s);

// {"count", "mean", "min", "p10", "p50", "p90", "max"}.
nlohmann::json dist_to_json(const ref::DistSummary& d);

// The whole report: problem, schedule, layers, buckets, adjacent pairs (with buckets), pooled
// figures, the two matrices (arrays of rows), the Shared layers' costs.
nlohmann::json overlap_to_json(const ref::OverlapReport& r);
// The search: loss name, initial loss, steps (flipped, loss, pattern, candidates), flips,
// losses, final pattern, per-layer costs.
nlohmann::json search_to_json(const ref::SearchResult& r);

// Fixed-width tables for a terminal.
std::string overlap_table(const ref::OverlapReport& r);
std::string search_table(const ref::SearchResult& r);

// CSV, long format, with a header line.
//   overlap: section,a,b,bucket,pos_begin,pos_end,metric,count,mean,min,p10,p50,p90,max
//            sections adjacent, adjacent_bucket, pooled, pooled_bucket, matrix, shared
//            (matrix and out_rel_error rows fill only mean)
//   search:  step,flipped,n_full,loss,pattern   (step 0 is the all-Full start, flipped -1)
std::string overlap_csv(const ref::OverlapReport& r);
std::string search_csv(const ref::SearchResult& r);

struct HeatmapOptions {
  std::string title;        // empty: a default title
  bool jaccard = false;     // plot matrix_jaccard instead of matrix_overlap
  double vmin = 0.0, vmax = 1.0;  // colour scale range (values outside are clamped)
};

std::string overlap_heatmap_svg(const ref::OverlapReport& r, const HeatmapOptions& opt = {});
std::string overlap_by_position_svg(const ref::OverlapReport& r, const std::string& title = "");
std::string search_loss_svg(const ref::SearchResult& r, const std::string& title = "");

// The picture of a diff report (indexshare diff --svg): one panel per judged layer, top to bottom.
// Each panel is a heatmap of the largest |err| / bound of attn.out over the d_v columns per
// (query row, head) on a log colour scale from 1e-3 to 1 (cells above 1, outside the bound, are
// red with a cross; grey: not judged), with the per-row recall of the candidate's positions as
// bars on the right, and the layer's findings (diagnoses, structure tests) as text under it; the
// findings that concern no single layer close the picture.
struct DiffPanel {
  int layer = 0;
  std::string label;                  // "layer 3 (Shared, source 2)"
  std::string verdict;                // one line: the layer's tensors and their verdicts
  int64_t rows = 0, heads = 0;        // 0: attn.out not judged
  std::vector<int64_t> row_ids;       // row labels (a sampled set's problem rows); empty: 0..rows-1
  std::vector<double> ratio;          // [rows * heads]
  std::vector<double> recall;         // [rows]; empty: no positions judged
  std::string recall_of;              // which tensor's positions
  std::vector<std::string> findings;  // lines of text under the panel
};
std::string diff_svg(const std::vector<DiffPanel>& panels, const std::vector<std::string>& general, const std::string& title);

// Writes `text` to `path` atomically (a temporary name, then rename); Error names the path.
void write_text_file(const std::string& path, const std::string& text);
// Writes several files as one: every (path, text) to PATH.tmp.PID first, and only once all are
// written are they renamed into place, so a failure leaves none of them. Error, before writing
// anything, if two outputs share a path or a path exists and is not a regular file (a report
// never replaces a folder, a FIFO or a device).
void write_text_files(const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace indexshare::io
