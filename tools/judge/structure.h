// indexshare: the judge's second layer, statistical structure tests (part of the comparison
// module, namespace cmp, beside judge/compare.h).
//
// The per-element bounds of compare.h are worst cases: sound, but wide exactly where a kernel bug
// hides, in errors that are small per element and *systematic*. A correct low-precision kernel's
// error is rounding noise: unbiased, unstructured, of the size its precision predicts. A bug is
// structure. These tests look for it.
//
// Model. A float output is viewed as [rows, heads, cols] (attn.out [s_q, h_q, d_v]; lse and
// max_logits [s_q, h_q, 1]; indexer logits [s_q, 1, s_kv]). With golden x and candidate y over
// the finite pairs, the error is e = y - x. For a direction d (one value per element) the
// least-squares coefficient of e on d over a group of elements is
//     b = sum d e / sum d^2
// and the directions tested are
//     scale    d = x                   e ~ b x: a normalisation or scale factor off by b
//     offset   d = rms(x over group)   e ~ b rms: an additive error of b rms(x) (b = mean / rms)
//     sm       d = dx/d(ln sm_scale)   e ~ b dx/dln(sm): the softmax scale off by a factor (1 + b)
//                                     (given by the caller: attn.out and lse, whole tensor only)
// Every b is relative (dimensionless), so one floor per tensor applies to every group.
// Standard error: a correct kernel's errors are correlated within a *cluster* (attn.out: one
// (row, head): P rounded to bf16 moves every column of the row-head by the same factor), so the
// standard error is cluster-robust (the sandwich estimator with the small-sample factor
// G / (G - 1)):
//     se(b) = sqrt(G / (G - 1) * sum_clusters (sum_{i in cluster} d_i (e_i - b d_i))^2) / sum d^2
// and the statistic t = b / se is compared with Student's t on G - 1 degrees of freedom.
//
// Groups (each tested separately): the whole tensor; each head; each column residue class mod 8,
// 16, 32, 64 and 128 (vector lanes, MMA tiles; only moduli <= cols / 2); each tile of 64 and of 128
// rows (CTA tiles; only when there are at least two tiles; a finding over a run of tiles names the
// rows it spans, "rows from 256 on"); the even and the odd rows (a row pattern: two rows of an MMA
// fragment handled differently); each sequence (when there are at least two). Kinds with a single
// group repeat the whole-tensor test and are skipped. A pattern over rows is named by its rows,
// never as "every element": a group kind whose flagged groups leave the rest clean wins.
//
// Flagged: a test is flagged when the systematic error is significantly LARGER THAN THE FLOOR,
// the largest a correct kernel can have (kFloor* below):
//     (|b| - floor) / se > t_crit(G - 1, alpha / 2m)
// i.e. the hypothesis |true b| <= floor is rejected by a t test on G - 1 degrees of freedom,
// Bonferroni over the m tests run on the tensor (family-wise alpha = kStructureAlpha), in a group
// of at least kMinClusters clusters. The floor keeps the judge sound against systematic effects
// of correct hardware that no emulation reproduces exactly (truncating accumulators): a kernel
// biased by up to the floor is flagged with probability at most alpha, in any group, however
// many elements the tensor has. A candidate without noise (se = 0) is flagged when |b| > floor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/judge/compare.h"

namespace indexshare::cmp {

// Family-wise false-alarm rate per tensor under the Gaussian model, before the floors (which
// make it smaller still). The calibration over correct kernel emulations (indexshare calibrate)
// records the largest statistic seen against its threshold.
constexpr double kStructureAlpha = 1e-3;
// A group needs this many clusters: the cluster-robust variance of fewer is too unreliable. Its t
// test has the effective clusters' degrees of freedom ((sum w)^2 / sum w^2 - 1, w each cluster's
// weight in the fit, its sum of x^2 for a scale): a group a few large values carry gets a large
// critical value (their noise agreeing by chance is no systematic error).
constexpr int64_t kMinClusters = 10;
constexpr double kRatioCap = 1e9;

// Floors: the largest relative systematic error a correct kernel can show, times a margin.
//   attn.out  u/8 = 2^-11 (4.9e-4). Every bf16 rounding a correct kernel does (P before PV, the
//             output) rounds to nearest even and is unbiased; its systematic effects are
//             f32-level: the folded sm_scale * log2(e) (2^-24), approximate exp2 / rcp (~2^-22),
//             and an f32 accumulator that truncates (tensor cores: at most k/4 * 2^-24 = 3e-5
//             at top-k 2048 for 4-term blocks). 2^-11 is 16x above the largest of these, and 10x
//             sharper than FlashMLA's cos_diff 7e-6 (which lets a uniform scale error of
//             sqrt(2 * 7e-6) = 3.7e-3 through).
//   lse, max_logits  2^-17 (7.6e-6): f32 logits and sums; the folded scale (2^-24) and lg2.approx
//             (~2^-22 absolute) are 8-100x below. FlashMLA accepts 2.01/65536 = 3.1e-5 relative
//             per element.
//   indexer logits   2^-10 (9.8e-4): a Hopper FP8 accumulator keeps about 14 bits and truncates;
//             each of the ~D/32 + 1 = 5 accumulation steps (D = 128) biases the partial sum by at
//             most 2^-14 toward zero, 3e-4 in all: 3x below. DeepGEMM's calc_diff < 5e-6 lets a
//             uniform scale error of 3.2e-3 through.
//   sm        the softmax-scale direction has the floor of its tensor.
constexpr double kFloorOut = 0x1p-11;
constexpr double kFloorLse = 0x1p-17;
constexpr double kFloorLogits = 0x1p-10;

struct StructureSpec {
  std::string tensor;           // for messages: "attn.out"
  int64_t rows = 0, heads = 1, cols = 1;
  int64_t cluster_cols = 1;     // cluster = (row, head, col / cluster_cols)
  bool lanes = false;           // test column residue classes
  std::vector<int64_t> row_seq; // sequence of each row (empty: one sequence)
  std::vector<int64_t> row_ids; // the problem row number of each row, for labels (empty: 0..rows-1)
  double floor = kFloorOut;
  const float* sm_dir = nullptr;  // dx/d(ln sm_scale) per element (whole-tensor test), optional
  // Or, in its place, what the test reads of it: per cluster (in order) the pair sum g^2, sum g e
  // over the cluster's finite pairs (sm_cluster_sums), so a caller need not hold the direction whole.
  const double* sm_sums = nullptr;
  std::string head_word = "head"; // how a head group is named
  std::string scale_meaning = "a normalisation or scale factor";  // what a scale error means here
};

// Sums of one cluster of the whole tensor (for tests pooled over layers).
struct ClusterSums {
  double n = 0, sxx = 0, sxe = 0, se = 0;  // count, sum x^2, sum x e, sum e
};

struct GroupTest {
  std::string stat;    // "scale", "offset" or "sm"
  std::string kind;    // "whole", "head", "mod8", ..., "rows64", "rows128", "seq"
  int64_t index = 0;   // group index within the kind (head h, residue r, tile b, sequence s)
  std::string label;   // "every element", "head 3", "columns = 0 mod 8", "rows 64-127", ...
  int64_t n = 0, clusters = 0, dof = 1;  // dof: the t test's degrees of freedom (effective clusters - 1)
  double b = 0, se = 0, t = 0, t_crit = 0, floor = 0;
  double explained = 0;  // b^2 sum d^2: the error's sum of squares the direction explains
  bool tested = false, flagged = false;
  bool fits = true;  // "sm": false when it explains under half the error's sum of squares (no finding)
  // How close to flagging: (|b| - floor) / (t_crit se), clamped to +-kRatioCap (> 1: flagged;
  // negative: the estimate is below the floor).
  double ratio() const;
};

struct StructureReport {
  std::vector<GroupTest> tests;       // every test run (whole-tensor tests first)
  std::vector<std::string> findings;  // one sentence per diagnosed systematic error
  int64_t m = 0;                      // tests run (for the Bonferroni threshold)
  bool flagged = false;
  double max_ratio = 0;               // the largest ratio() over the tests (margin to flagging)
  double max_b_over_floor = 0;        // the largest |b| / floor, and |t| / t_crit, over the tests
  double max_t_over_crit = 0;
  std::vector<ClusterSums> clusters;  // the whole tensor's clusters, in order
};

// Runs every test on golden x and candidate y (both rows * heads * cols floats, row-major).
// Non-finite pairs are left out (compare_floats judges them). The sweeps run in parallel over fixed
// blocks of rows, summed in the fixed order documented in judge/structure.cc: the report is the same
// for any thread count.
StructureReport structure_tests(const StructureSpec& spec, const float* x, const float* y);

// The softmax-scale direction's part of the structure tests for `clusters` consecutive clusters of
// `cols` elements each (x golden, y candidate, g the direction, all clusters * cols floats): out[2c]
// = sum g^2 and out[2c + 1] = sum g (y - x) over cluster c's pairs with x and y finite, in double,
// columns ascending. A caller that computes the direction block by block folds each block at once
// (StructureSpec::sm_sums) instead of holding a float per element.
void sm_cluster_sums(const float* x, const float* y, const float* g, int64_t clusters, int64_t cols, double* out);

// The whole-tensor scale and offset tests over clusters gathered from several tensors (e.g. every
// Shared layer's attn.out): spec gives the names and the floor.
StructureReport pooled_tests(const StructureSpec& spec, const std::vector<ClusterSums>& clusters);

// Copies a structure report's summary into a comparison report: the number of tests, the margins,
// the flagged tests and the findings (the verdict is the caller's).
void summarize(const StructureReport& st, Report& r);

// compare_floats, then the structure tests on the same pairs: a flagged test fails the report
// (its findings become reasons and diagnoses), and the report carries the summary. `structure`
// receives the full structure report when given.
Report compare_structured(const std::string& tensor, const Tensor<float>& expected, const Tensor<float>& got,
                          const FloatRule& rule, const StructureSpec& spec, StructureReport* structure = nullptr);

// Student's t quantile: the q with P(T > q) = p for T ~ t(nu), nu >= 1 (bisection on the exact
// CDF). Exposed for the tests.
double t_upper_quantile(double p, int64_t nu);
double t_upper_tail(double q, int64_t nu);

}  // namespace indexshare::cmp
