// indexshare: cross-layer top-k overlap statistics and the greedy IndexCache pattern search.
//
// Part 1, overlap. Every layer that has indexer inputs computes its own top-k O_l [s_q, topk]
// (sequence-local positions, -1 padded; ref/topk.h). For a query row t with valid length
// L_t = ke[t] - ks[t] a top-k selects min(topk, L_t) distinct positions. Rows with L_t <= topk
// select every key of their window, so any two layers agree on them trivially: such rows are
// TRIVIAL, counted apart (trivial_rows), and left out of every headline figure. On a
// non-trivial row both sets have exactly topk elements and
//     overlap(A, B) = |A ∩ B| / |A|          (= |A ∩ B| / topk, the IndexCache ratio)
//     jaccard(A, B) = |A ∩ B| / |A ∪ B|
// A top-k tensor whose row t does not hold exactly min(topk, L_t) distinct positions in
// [0, L_t) plus -1 padding is an input error (Error names the tensor and row).
//
// Distributions (DistSummary): count, mean, min, p10, p50, p90, max of a list of per-row values.
// Percentiles use the NEAREST-RANK rule: with the n values sorted ascending x_1 <= ... <= x_n,
// the p-th percentile (p integer in [0, 100]) is x_r with r = max(1, ceil(p * n / 100)), so p0 is
// the minimum, p100 the maximum, and every reported percentile is one of the values. An empty
// list gives count 0 and NaN everywhere else.
//
// Query-position buckets: row t (query position start_pos + t) lies in bucket
// floor(t * n_buckets / s_q); bucket b covers rows [ceil(b s_q / n_b), ceil((b + 1) s_q / n_b)).
// With s_q < n_buckets some buckets are empty (count 0).
//
// Part 2, what sharing costs a Shared layer l whose source is j (U = O_j the used positions,
// O = O_l the layer's own would-be positions; only layers that have indexer inputs):
//   recall       |U ∩ O| / |O| per non-trivial row (= overlap(O, U));
//   mass_used    sum over s in U of Pbar[t, s], where P_h[t, :] is the DENSE softmax of the
//                layer's attention logits (q[t,h] . kv[s]) * sm_scale over the causal window
//                [ks[t], ke[t]) in double, and Pbar the mean over the h_q heads. The attention
//                sink is ignored: it scales every key's probability by the same factor, so the
//                shares of key mass do not depend on it. mass_own is the same sum over O;
//   mass_recall  the share of the mass the all-Full layer attends to that U keeps, per head
//                     sum_{s in U ∩ O} P_h[t, s] / sum_{s in O} P_h[t, s]
//                   = sum_{s in U ∩ O} pO_h(s),   pO_h = softmax of the logits over O alone,
//                averaged over heads (computed in the second form, so no division by a sum
//                that underflowed; exactly 1 when O ⊆ U, exactly 0 when U ∩ O is empty);
//   out_rel_error  ||out(U) - out(O)||_F / ||out(O)||_F over the whole layer [s_q, h_q, d_v],
//                with out the f32 attention output (attn.out) of the layer over the positions
//                U resp. O, in double; 0 when both norms are 0, +inf when only ||out(O)|| is.
//
// Part 3, greedy pattern search (IndexCache "Algorithm 1", training-free). Every layer needs
// indexer inputs (own=yes); each layer's own top-k is computed once. A schedule only decides
// which top-k a layer uses: layer l uses O_{source(l)}. The proxy loss of a schedule is
//     loss(schedule) = (1 / n_layers) * sum_l c(l, source(l)),   c(l, l) = 0,
// a mean over ALL layers (Full layers contribute 0), with the per-layer cost c(l, j) of layer l
// using U = O_j instead of its own O = O_l (trivial rows contribute 0 to every cost):
//   output  out_rel_error above: the relative attention-output error against the all-Full
//           stack (whose layer l attends over O_l).
//   mass    1 - mass_recall above, averaged over the non-trivial rows and heads: the share of
//           the all-Full stack's attention mass lost. (Not 1 - mass_used: the synthetic indexer
//           is not trained on the attention, so raw captured mass is not maximal at all-Full;
//           a proxy loss must be 0 at the all-Full stack and grow with the damage.)
//   kl      KL(pO_h || qeps_h) averaged over the non-trivial rows and heads, where pO_h is the
//           attention distribution of the all-Full layer (softmax of the logits over O) and qU_h
//           the one of the schedule (softmax over U). Positions of O missing from U have
//           qU_h = 0, so the divergence is skewed (Lee's skew divergence):
//               qeps_h = (1 - eps) qU_h + eps pO_h,   eps = kKlSkew = 1e-6,
//               KL = sum_{s in O, pO_h(s) > 0} pO_h(s) ln(pO_h(s) / qeps_h(s))
//           which is finite (<= ln(1 / eps)), >= 0, and taken as exactly 0 when U = O.
// Search: start all Full; at each step try flipping every Full layer except layer 0 to Shared,
// evaluate the loss of each candidate schedule, commit the candidate with the lowest loss (ties:
// the lowest layer index); stop when n_full layers remain Full.
// Costs c(l, j) are computed on first use and cached, so each (layer, source) pair is evaluated
// at most once during a search.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ref/kernels.h"
#include "ref/layer.h"
#include "ref/problem.h"
#include "ref/schedule.h"
#include "ref/stack.h"
#include "ref/tensor.h"

namespace indexshare::ref {

// ---- Distributions ------------------------------------------------------------------------

struct DistSummary {
  int64_t count = 0;
  double mean = std::numeric_limits<double>::quiet_NaN();
  double min = std::numeric_limits<double>::quiet_NaN();
  double p10 = std::numeric_limits<double>::quiet_NaN();
  double p50 = std::numeric_limits<double>::quiet_NaN();
  double p90 = std::numeric_limits<double>::quiet_NaN();
  double max = std::numeric_limits<double>::quiet_NaN();
};

// The nearest-rank percentile of `sorted` (ascending, non-empty), percent in [0, 100].
double percentile_nearest_rank(const std::vector<double>& sorted, int percent);

// Summary of `values` (any order); the mean sums the values in ascending order, in double.
DistSummary summarize_distribution(std::vector<double> values);

// ---- Per-row set overlap -------------------------------------------------------------------

// L_t = ke[t] - ks[t] per row.
std::vector<int64_t> valid_lengths(const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

// Throws Error (naming `what` and the row) unless topk is [s_q, k] with s_q = valid_len.size()
// and each row holds exactly min(k, L_t) distinct positions in [0, L_t), the rest -1.
void check_topk_rows(const Tensor<int32_t>& topk, const std::vector<int64_t>& valid_len,
                     const std::string& what);

// The valid (>= 0) positions of row t, ascending.
std::vector<int32_t> row_positions(const Tensor<int32_t>& topk, int64_t t);

struct RowOverlap {
  bool trivial = false;     // L_t <= topk: every key selected; overlap/jaccard are NaN
  int64_t common = 0;       // |A ∩ B|
  int64_t size_a = 0, size_b = 0, union_size = 0;
  double overlap = std::numeric_limits<double>::quiet_NaN();  // |A ∩ B| / |A|
  double jaccard = std::numeric_limits<double>::quiet_NaN();  // |A ∩ B| / |A ∪ B|
};

// Per-row overlap of two top-k tensors of the same shape (both checked by check_topk_rows).
std::vector<RowOverlap> row_overlaps(const Tensor<int32_t>& a, const Tensor<int32_t>& b,
                                     const std::vector<int64_t>& valid_len);

struct QueryBucket {
  int64_t t_begin = 0, t_end = 0;  // query rows [t_begin, t_end)
  int64_t pos_begin = 0, pos_end = 0;  // query positions start_pos + [t_begin, t_end)
};

// The most query-position buckets a report takes.
inline constexpr int kMaxBuckets = 4096;
// The n_buckets buckets of s_q query rows (see the header). Throws Error unless 1 <= n_buckets <= kMaxBuckets.
std::vector<QueryBucket> query_buckets(int64_t s_q, int n_buckets, int64_t start_pos = 0);

struct PairOverlap {
  int a = 0, b = 0;                // layer indices (informational)
  int64_t rows = 0, trivial_rows = 0;
  DistSummary overlap, jaccard;    // over the non-trivial rows
  std::vector<DistSummary> overlap_by_bucket;  // per query bucket, non-trivial rows only
};

PairOverlap pair_overlap(const Tensor<int32_t>& a, const Tensor<int32_t>& b,
                         const std::vector<int64_t>& valid_len, const std::vector<QueryBucket>& buckets,
                         int layer_a = 0, int layer_b = 1);

// ---- Attention probabilities and errors ----------------------------------------------------

// (q[t, h, :] . kv[row, 0, :]) * sm_scale in double, d ascending: the logit sparse_attention and
// dense_attention compute.
double attention_logit(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, int64_t t, int64_t h,
                       int64_t row, double sm_scale);

// Dense causal attention probabilities [s_q, h_q, s_kv] in double: row t, head h holds the softmax
// of the logits over the kv rows [ks[t], ke[t]) (max-subtracted, summed in ascending row order)
// and 0 outside that window. An empty window leaves the row all 0. No sink (see the header).
Tensor<double> dense_probabilities(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale,
                                   const Tensor<int32_t>& ks, const Tensor<int32_t>& ke);

// ||got - ref||_F / ||ref||_F in double; 0 if both norms are 0, +inf if only ||ref|| is 0.
double relative_error(const Tensor<float>& got, const Tensor<float>& ref);

// relative_error in parts: add() consecutive element ranges in element order (the sums run on
// across calls, so the parts of a tensor give relative_error's bits), then value().
struct RelativeError {
  double diff2 = 0.0, ref2 = 0.0;
  void add(const float* got, const float* ref, int64_t n);
  double value() const;
};

// For one row t of layer inputs `in`: per head, the mass recall, its complement and the skewed KL,
// for own positions O and used positions U (sequence-local, ascending, as row_positions gives).
// The per-head sums kept = sum_{s in O ∩ U} pO_h(s) and lost = sum_{s in O \ U} pO_h(s) are
// divided by their total (1 up to rounding), so both shares lie in [0, 1] and are exact at the
// ends. An empty O, or U = O, gives mass_kept 1, mass_lost 0, kl 0.
struct RowDivergence {
  double mass_kept = 1;  // mean over heads of kept / (kept + lost): the mass recall
  double mass_lost = 0;  // mean over heads of lost / (kept + lost)
  double kl = 0;         // mean over heads of KL(pO_h || qeps_h); exactly 0 when U = O
};
RowDivergence row_divergence(const Problem& p, const LayerInputs& in, int64_t t,
                             const std::vector<int32_t>& own, const std::vector<int32_t>& used);

// ---- Overlap report --------------------------------------------------------------------------

struct OverlapOptions {
  int n_buckets = 8;        // query-position buckets
  bool shared_stats = true; // compute the per-Shared-layer costs (dense attention: the slow part)
  Kernels kernels;          // the kernels of the recomputations (ref's; simd::kernels(): the same bits)
};

struct LayerInfo {
  int layer = 0;
  LayerKind kind = LayerKind::full;
  int source = 0;
  bool has_own_topk = false;
};

struct SharedLayerStats {
  int layer = 0, source = 0;
  int64_t rows = 0, trivial_rows = 0;
  DistSummary recall;       // |U ∩ O| / |O|
  DistSummary mass_used;    // dense head-mean attention mass on U
  DistSummary mass_own;     // dense head-mean attention mass on O
  DistSummary mass_recall;  // RowDivergence::mass_kept
  double out_rel_error = 0; // ||out(U) - out(O)||_F / ||out(O)||_F
};

struct OverlapReport {
  std::string problem;      // canonical descriptor
  std::string pattern;      // the schedule, F/S
  int n_layers = 0;
  int64_t s_q = 0, s_kv = 0, topk = 0, start_pos = 0;
  int64_t rows = 0, trivial_rows = 0;  // per layer pair (all layers share the causal windows)
  std::vector<LayerInfo> layers;
  std::vector<QueryBucket> buckets;
  // Adjacent pairs (l, l + 1) of own top-k where both layers have one.
  std::vector<PairOverlap> adjacent;
  DistSummary adjacent_overlap, adjacent_jaccard;  // pooled over every adjacent pair's rows
  std::vector<DistSummary> adjacent_by_bucket;     // pooled, per bucket
  // All pairs of own top-k: n_layers x n_layers, row-major, mean over non-trivial rows; diagonal
  // 1; NaN where a layer has no own top-k or no row is non-trivial.
  std::vector<double> matrix_overlap, matrix_jaccard;
  DistSummary offdiag_overlap;  // the distribution of the i < j entries of matrix_overlap
  // Shared layers with their own top-k, in layer order.
  std::vector<SharedLayerStats> shared;

  double overlap_at(int i, int j) const { return matrix_overlap[size_t(i) * size_t(n_layers) + size_t(j)]; }
  double jaccard_at(int i, int j) const { return matrix_jaccard[size_t(i) * size_t(n_layers) + size_t(j)]; }
};

// The per-row part of one Shared layer's statistics, over the rows `li` and `o` hold (every row,
// or a block of rows: a distributed report concatenates the blocks in row order): the values of
// the non-trivial rows in row order, the trivial rows' count, and the layer's attention output over
// its own positions O (the reference of out_rel_error). `o` must have own_topk and used_topk.
struct SharedLayerRows {
  int64_t trivial_rows = 0;
  std::vector<double> recall, mass_used, mass_own, mass_recall;
  Tensor<float> own_out;
};
SharedLayerRows shared_layer_rows(const Problem& p, const LayerInputs& li, const StackLayerOutputs& o,
                                  const Kernels& k = {});
// The statistics of Shared layer `layer` (source `source`) over s_q rows from every row's values
// and the layer's out_rel_error.
SharedLayerStats shared_layer_stats(int layer, int source, int64_t s_q, SharedLayerRows rows, double out_rel_error);

// Report of a stack already run: `in` its inputs, `out` run_stack(p, schedule, in).
// Throws Error if sizes disagree or the layers' causal windows differ.
OverlapReport overlap_report(const Problem& p, const std::vector<LayerInputs>& in,
                             const std::vector<StackLayerOutputs>& out, const OverlapOptions& opt = {});

// The report of layers known only by their own selections (part 1's statistics; the dense-attention
// statistics of Shared layers are not computed): own[j] [s_q, k] over keys [0, n_keys), -1 padded,
// row t's window [0, ke[t]) (rows with ke[t] <= k pick every key: TRIVIAL); pattern one F/S per
// layer, first F; a Full layer without own selections is an Error naming `what` and layer[j] (its
// model layer number). DeepSeek-V4's C4A block indices (ref/v4/sharing.h) and GLM-5.3's pools
// (ref/kpool/sharing.h) are reported through it.
OverlapReport own_selection_report(int64_t n_keys, int64_t k, const Tensor<int32_t>& ke, const std::vector<Tensor<int32_t>>& own,
                                   const std::vector<int>& layer, const std::string& pattern, const std::string& what,
                                   const std::string& problem, int n_buckets = 8);

// Generates p's stack (make_stack_inputs), runs it (without keeping logits) and reports.
OverlapReport overlap_report(const Problem& p, const OverlapOptions& opt = {});

// ---- Greedy search ---------------------------------------------------------------------------

enum class SearchLoss { output, mass, kl };

inline constexpr double kKlSkew = 1e-6;

std::string search_loss_name(SearchLoss loss);             // "output", "mass", "kl"
SearchLoss parse_search_loss(const std::string& name);     // throws Error naming the bad value
std::vector<std::string> search_loss_names();

// What the greedy search reads: n layers and the cost c(l, j) of layer l using layer j's top-k.
// A DeepSeek-V4 stack's C4A layers are searched through this too (ref/v4/sharing.h).
class LayerCosts {
 public:
  virtual ~LayerCosts() = default;
  virtual int n_layers() const = 0;
  virtual SearchLoss loss() const = 0;
  // c(layer, source) for 0 <= source <= layer; c(l, l) = 0.
  virtual double layer_cost(int layer, int source) = 0;
  // (1 / n_layers) sum_l c(l, s.source(l)), summed in layer order.
  double schedule_loss(const Schedule& s);
};

// The output loss's costs from out(j, i), layer j's output over layer i's selections:
// c(j, i) = relative_error(out(j, i), out(j, j)), each computed once (c(j, j) = 0). The kinds whose
// layers are known by their own selections use it (DeepSeek-V4's C4A layers, GLM-5.3's DSA layers,
// HY V4's layers); `what` names a layer in errors ("C4A layer").
class OutputCosts : public LayerCosts {
 public:
  OutputCosts(int n_layers, std::function<Tensor<float>(size_t, size_t)> out, std::string what);
  int n_layers() const override { return int(own_out_.size()); }
  SearchLoss loss() const override { return SearchLoss::output; }
  double layer_cost(int layer, int source) override;

 private:
  std::function<Tensor<float>(size_t, size_t)> out_;
  std::string what_;
  std::vector<Tensor<float>> own_out_;
  std::map<std::pair<int, int>, double> cache_;
};

// Per-layer costs c(l, j) with caching (see the header). Holds references to p and in.
class ScheduleEvaluator : public LayerCosts {
 public:
  // Throws Error unless in.size() == p.n_layers, every layer has indexer inputs and all layers
  // share layer 0's causal windows. Computes every layer's own top-k.
  // k: the kernels of the logits, top-k and attention it recomputes (the same bits either way).
  ScheduleEvaluator(const Problem& p, const std::vector<LayerInputs>& in, SearchLoss loss, const Kernels& k = {});
  int n_layers() const override { return int(own_.size()); }
  SearchLoss loss() const override { return loss_; }
  const Tensor<int32_t>& own_topk(int layer) const { return own_.at(size_t(layer)); }
  double layer_cost(int layer, int source) override;

 protected:
  // How a cost is formed from the evaluator's rows (every row of `in`): the output loss from the
  // layer's output over U (`got`) and over O (`own`), relative_error; the mass and kl losses from
  // the per-row terms of the non-trivial rows, in row order, as their mean (0 when there are none).
  // A distributed search (tools/lib/distributed.h), whose evaluator holds a block of the rows,
  // overrides them to combine every block in row order, with the same bits.
  virtual double output_cost(const Tensor<float>& got, const Tensor<float>& own);
  virtual double row_mean_cost(const std::vector<double>& terms);

 private:
  const Problem& p_;
  const std::vector<LayerInputs>& in_;
  SearchLoss loss_;
  Kernels k_;
  std::vector<int64_t> valid_len_;
  std::vector<Tensor<int32_t>> own_;
  std::vector<Tensor<float>> own_out_;  // attention output over own positions (output loss)
  std::map<std::pair<int, int>, double> cache_;
};

struct SearchOptions {
  int n_full = 1;                       // stop when this many layers are Full (1 <= n_full <= nl)
  SearchLoss loss = SearchLoss::output;
  Kernels kernels;                      // as OverlapOptions::kernels
};

struct SearchStep {
  int flipped = 0;                      // the layer committed to Shared at this step
  double loss = 0;                      // loss of the schedule after the flip
  std::string pattern;                  // the schedule after the flip
  std::vector<int> candidates;          // the layers tried, ascending
  std::vector<double> candidate_losses; // their losses
};

struct SearchResult {
  std::string problem;                  // canonical descriptor
  SearchLoss loss = SearchLoss::output;
  int n_layers = 0, n_full = 0;
  double initial_loss = 0;              // loss of the all-Full schedule (0 by construction)
  std::vector<SearchStep> steps;
  std::vector<int> flips;               // steps[i].flipped
  std::vector<double> losses;           // steps[i].loss
  std::string pattern;                  // the final schedule
  std::vector<double> layer_costs;      // c(l, source(l)) of the final schedule
};

// The greedy search over inputs `in` (all with indexer inputs). Throws Error if n_full is not in
// [1, n_layers] or the inputs are unsuitable (see ScheduleEvaluator).
SearchResult greedy_search(const Problem& p, const std::vector<LayerInputs>& in, const SearchOptions& opt);
// The same over an evaluator built by the caller (opt.loss and opt.kernels are the evaluator's).
SearchResult greedy_search(const Problem& p, ScheduleEvaluator& ev, const SearchOptions& opt);
// The same over any costs; `problem` is the result's descriptor text.
SearchResult greedy_search(const std::string& problem, LayerCosts& ev, const SearchOptions& opt);

// Generates p's layers, every one with indexer inputs (p.sched and p.own are ignored), and searches.
SearchResult greedy_search(const Problem& p, const SearchOptions& opt);

// The loss of one schedule over `in` (a one-off ScheduleEvaluator).
double schedule_loss(const Problem& p, const std::vector<LayerInputs>& in, const Schedule& s, SearchLoss loss);

}  // namespace indexshare::ref
