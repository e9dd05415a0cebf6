#include "tools/judge/structure.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <numbers>

#include "ref/tensor.h"

namespace indexshare::cmp {

// ---- Student's t ---------------------------------------------------------------------------------

// P(T > q) for integer nu (Abramowitz & Stegun 26.7.3 / 26.7.4: A = P(|T| <= q) as a finite
// series in theta = atan(q / sqrt(nu))). nu above 1000 is evaluated at 1000: the quantile only
// shrinks with nu, so that is conservative.
double t_upper_tail(double q, int64_t nu) {
  require(nu >= 1, "t_upper_tail: nu >= 1");
  if (q < 0) return 1 - t_upper_tail(-q, nu);
  nu = std::min<int64_t>(nu, 1000);
  const double th = std::atan(q / std::sqrt(double(nu))), s = std::sin(th), c = std::cos(th), c2 = c * c;
  double A;
  if (nu % 2 == 1) {
    double sum = 0, term = c;
    if (nu > 1) {
      sum = term;
      for (int64_t k = 3; k <= nu - 2; k += 2) { term *= c2 * double(k - 1) / double(k); sum += term; }
    }
    A = 2 / std::numbers::pi * (th + s * sum);
  } else {
    double sum = 1, term = 1;
    for (int64_t k = 2; k <= nu - 2; k += 2) { term *= c2 * double(k - 1) / double(k); sum += term; }
    A = s * sum;
  }
  return std::max(0.0, (1 - A) / 2);
}

double t_upper_quantile(double p, int64_t nu) {
  require(p > 0 && p < 0.5, "t_upper_quantile: p in (0, 0.5)");
  double lo = 0, hi = 1;
  while (t_upper_tail(hi, nu) > p && hi < 1e15) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-9 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (t_upper_tail(mid, nu) > p ? lo : hi) = mid;
  }
  return hi;
}

double GroupTest::ratio() const {
  if (!tested) return -kRatioCap;
  const double excess = std::fabs(b) - floor;
  if (se > 0) return std::clamp(excess / (t_crit * se), -kRatioCap, kRatioCap);
  return excess > 0 ? kRatioCap : -kRatioCap;
}

// ---- The tests -----------------------------------------------------------------------------------

namespace {

// A kind of group. Every kind but the column classes is constant over a cluster (a cluster is
// one (row, head, column block)); column classes split a cluster by column mod `modulus`.
struct Kind {
  std::string name;
  int64_t n_groups = 0;
  int64_t modulus = 0;   // column residue classes
  int64_t tile = 0;      // row tiles
  bool head = false, seq = false;
  int64_t rowmod = 0;    // row residue classes (every other row: a kernel whose two row halves of a tile differ)
};

// The group of a cluster at (row r, head h) for a kind that is constant over clusters.
int64_t group_of(const Kind& k, const std::vector<int64_t>& row_seq, int64_t r, int64_t h) {
  if (k.tile) return r / k.tile;
  if (k.rowmod) return r % k.rowmod;
  if (k.head) return h;
  if (k.seq) return row_seq.empty() ? 0 : row_seq[size_t(r)];
  return 0;
}

std::string label(const Kind& k, int64_t g, const StructureSpec& s) {
  auto row_id = [&](int64_t r) { return s.row_ids.empty() ? r : s.row_ids[size_t(r)]; };
  char buf[160];
  if (k.modulus) std::snprintf(buf, sizeof buf, "columns = %lld mod %lld", (long long)g, (long long)k.modulus);
  else if (k.tile) {
    const int64_t a = g * k.tile, b = std::min(s.rows, (g + 1) * k.tile) - 1;
    if (s.row_ids.empty()) std::snprintf(buf, sizeof buf, "rows %lld-%lld (one %lld-row tile)", (long long)a, (long long)b, (long long)k.tile);
    else std::snprintf(buf, sizeof buf, "sampled rows %lld-%lld (problem rows %lld..%lld; one %lld-row tile)", (long long)a, (long long)b,
                       (long long)row_id(a), (long long)row_id(b), (long long)k.tile);
  } else if (k.rowmod) std::snprintf(buf, sizeof buf, "rows = %lld mod %lld", (long long)g, (long long)k.rowmod);
  else if (k.head) std::snprintf(buf, sizeof buf, "%s %lld", s.head_word.c_str(), (long long)g);
  else if (k.seq) std::snprintf(buf, sizeof buf, "sequence %lld", (long long)g);
  else std::snprintf(buf, sizeof buf, "every element");
  return buf;
}

void finish(StructureReport& rep, const StructureSpec& s, const std::vector<std::string>& kinds, const float* x = nullptr,
            const float* y = nullptr);

// The structure sweeps' blocks: whole rows, at least this many elements each (see structure_tests).
constexpr int64_t kBlockElements = int64_t(1) << 18;
// The share of the error's sum of squares a softmax-scale finding must explain to be named (finish()).
constexpr double kSmExplains = 0.5;
// The share a scale or an offset over every element must explain to be named. A real scale beside
// rounding explains most of the error (0.28% on a bf16 output rounded twice: 0.36); a loss computed
// without its ReLU, or over another support, changes the gradients in a way whose projection on
// their scale is 0.03-0.28 of it: a measured 1.5x "scale" there would be a false lead.
constexpr double kWholeExplains = 1.0 / 3.0;
// ... or when what it leaves is at most this relative RMS: a bf16 rounding (half an ulp, at most
// 2^-8 of the value) with a margin of 2.
constexpr double kRoundingResidual = 0x1p-7;

// Sums over a set of finite pairs: count, x^2, x e, e, and for the softmax-scale direction g:
// g^2, g e.
struct Sums {
  double n = 0, sxx = 0, sxe = 0, se = 0, sgg = 0, sge = 0;
  void add(const Sums& o) { n += o.n; sxx += o.sxx; sxe += o.sxe; se += o.se; sgg += o.sgg; sge += o.sge; }
};

// The degrees of freedom of a group's t test: its effective clusters less one, (sum w)^2 / sum w^2
// (Kish; w each cluster's weight in the fit, summing to sdd; w2 their squares summed), rounded
// down, at least 1 and at most clusters - 1. A group that two large values carry has about one: its
// critical value is then large, and two noisy values agreeing by chance flag nothing.
inline int64_t effective_dof(int64_t clusters, double sdd, double w2) {
  const double eff = w2 > 0 ? sdd * sdd / w2 : double(clusters);
  return std::max<int64_t>(1, std::min<int64_t>(clusters, int64_t(std::floor(eff))) - 1);
}

// 1 / (1 - h) for a cluster of weight part in a group of weight whole (h = part / whole), capped
// at 1e6 where one cluster holds the whole group.
inline double jack(double part, double whole) { return whole > 0 ? 1.0 / std::max(1.0 - part / whole, 1e-6) : 1.0; }

// Per group: its sums (pass 1), then the coefficients, then the cluster-robust variances (pass 2).
struct GroupAcc {
  Sums s;
  double b_scale = 0, b_off = 0, b_sm = 0, rms = 0;
  double v_scale = 0, v_off = 0, v_sm = 0;
  double w2_scale = 0, w2_off = 0, w2_sm = 0;  // the clusters' weights (their sum d^2) squared, summed
  int64_t clusters = 0;
  void coefficients() {
    b_scale = s.sxx > 0 ? s.sxe / s.sxx : 0.0;
    rms = s.n > 0 ? std::sqrt(s.sxx / s.n) : 0.0;
    b_off = rms > 0 ? s.se / (rms * s.n) : 0.0;   // sum rms e / sum rms^2
    b_sm = s.sgg > 0 ? s.sge / s.sgg : 0.0;
  }
  // One cluster's part of the group, in pass 2: d (e - b d) summed over it, over 1 - h (the
  // cluster's leverage h: its share of sum d^2), squared. Dividing by 1 - h makes the variance the
  // jackknife's (CR3): a cluster that dominates the group no longer fits its own estimate, so a
  // group whose estimate is one element's noise (a Delta near its own cancellation) is not taken
  // for a systematic error.
  void residual(const Sums& c) {
    const double us = (c.sxe - b_scale * c.sxx) * jack(c.sxx, s.sxx), uo = rms * (c.se - b_off * rms * c.n) * jack(c.n, s.n),
                 ug = (c.sge - b_sm * c.sgg) * jack(c.sgg, s.sgg);
    v_scale += us * us;
    v_off += uo * uo;
    v_sm += ug * ug;
    w2_scale += c.sxx * c.sxx;
    w2_off += c.n * c.n;
    w2_sm += c.sgg * c.sgg;
  }
};

// The column classes of every modulus, packed: the classes j mod 128 >> f (f = 0..4: moduli 128,
// 64, 32, 16, 8) at offset kFoldAt[f] + j, 248 in all. Struct of arrays (one array per sum) so that
// the loops over the classes vectorize.
constexpr int kFolds = 5, kClasses = 248;
constexpr int kFoldAt[kFolds] = {0, 128, 192, 224, 240};
int fold_of(int64_t modulus) { return std::countr_zero(uint64_t(128 / modulus)); }
struct Bins {
  double n[kClasses], sxx[kClasses], sxe[kClasses], se[kClasses], sgg[kClasses], sge[kClasses];
};
// One block's part of the column-class groups: pass 1 the sums (n .. sge) and the cluster counts,
// pass 2 the squared residuals (scale, offset, sm).
struct LanePart {
  Bins s;
  double clusters[kClasses];
  double v_scale[kClasses], v_off[kClasses], v_sm[kClasses];
  double w2_scale[kClasses], w2_off[kClasses], w2_sm[kClasses];
};

// The pairs of columns [c0, c1) of one (row, head) (x, y, g point at its column 0) summed into the
// classes of column mod 128, each in column order; a non-finite pair adds 0 to every sum (which
// leaves a sum that starts at +0 unchanged) and is not counted. Then the coarser moduli: class
// j mod m = class j + class j + m mod 2m (assigned, so only the 128 finest classes start at 0).
// Without the direction (kDir false) sgg and sge are neither cleared nor written: they hold the
// zeros of the caller's Bins, value-initialised once per sweep, whose every call has the same kDir.
template <bool kDir>
void cluster_bins(const float* x, const float* y, const float* g, int64_t c0, int64_t c1, Bins& B) {
  std::fill_n(B.n, 128, 0.0);
  std::fill_n(B.sxx, 128, 0.0);
  std::fill_n(B.sxe, 128, 0.0);
  std::fill_n(B.se, 128, 0.0);
  if constexpr (kDir) {
    std::fill_n(B.sgg, 128, 0.0);
    std::fill_n(B.sge, 128, 0.0);
  }
  for (int64_t c = c0; c < c1;) {
    const int64_t j0 = c % 128, len = std::min(c1 - c, 128 - j0);
    double *n = B.n + j0, *sxx = B.sxx + j0, *sxe = B.sxe + j0, *se = B.se + j0, *sgg = B.sgg + j0, *sge = B.sge + j0;
    const float *xs = x + c, *ys = y + c, *gs = kDir ? g + c : nullptr;
    for (int64_t k = 0; k < len; ++k) {
      const float xf = xs[k], yf = ys[k], gf = kDir ? gs[k] : 0.0f;
      const bool fin = finite_f32(xf) & finite_f32(yf);
      const double xv = fin ? double(xf) : 0.0, e = fin ? double(yf) - double(xf) : 0.0, gv = fin ? double(gf) : 0.0;
      n[k] += fin ? 1.0 : 0.0;
      sxx[k] += xv * xv;
      sxe[k] += xv * e;
      se[k] += e;
      if constexpr (kDir) {
        sgg[k] += gv * gv;
        sge[k] += gv * e;
      }
    }
    c += len;
  }
  for (int f = 1; f < kFolds; ++f) {
    const int m = 128 >> f, P = kFoldAt[f - 1], Q = kFoldAt[f];
    for (int j = 0; j < m; ++j) {
      B.n[Q + j] = B.n[P + j] + B.n[P + j + m];
      B.sxx[Q + j] = B.sxx[P + j] + B.sxx[P + j + m];
      B.sxe[Q + j] = B.sxe[P + j] + B.sxe[P + j + m];
      B.se[Q + j] = B.se[P + j] + B.se[P + j + m];
      if constexpr (kDir) {
        B.sgg[Q + j] = B.sgg[P + j] + B.sgg[P + j + m];
        B.sge[Q + j] = B.sge[P + j] + B.sge[P + j + m];
      }
    }
  }
}

// The group kinds tested on a tensor of the spec's shape, in report order: the whole tensor, heads,
// column classes mod 8..128 (s.lanes), row blocks of 64 and 128, rows mod 2, sequences (row_seq).
std::vector<Kind> structure_kinds(const StructureSpec& s) {
  const int64_t R = s.rows, H = s.heads, C = s.cols;
  std::vector<Kind> kinds = {{"whole", 1}};
  if (H >= 2) kinds.push_back({"head", H, 0, 0, true});
  if (s.lanes)
    for (int64_t m : {8, 16, 32, 64, 128})
      if (m <= C / 2) kinds.push_back({"mod" + std::to_string(m), m, m});
  for (int64_t t : {64, 128})
    if (R > t) kinds.push_back({"rows" + std::to_string(t), (R + t - 1) / t, 0, t});
  if (R >= 4) kinds.push_back({"rowmod2", 2, 0, 0, false, false, 2});
  int64_t n_seq = 1;
  for (int64_t q : s.row_seq) n_seq = std::max(n_seq, q + 1);
  if (n_seq >= 2) kinds.push_back({"seq", n_seq, 0, 0, false, true});
  return kinds;
}

// What a sweep over the clusters reads and writes (structure_tests): the data, the shape and its
// clusters, the column classes tested [lo, kClasses), every cluster's totals (pass 1 writes them,
// pass 2 reads them) and the column-class groups' coefficients for pass 2, packed as the classes.
struct Sweep {
  const StructureSpec& s;
  const float *x, *y;
  int64_t R, H, C, CC, NC, block_rows;
  bool lanes;
  int lo;
  std::vector<Sums>& totals;
  const std::vector<double>&cb_scale, &cb_off, &cb_sm, &crms;  // pass 2 reads them
  const std::vector<double>& cw;  // the classes' sum x^2, n and sum g^2 (kClasses each), for the leverages
};

// One block of whole rows of pass `pass`: each cluster's sums (into w.totals on pass 1) and, with
// column classes, the block's part of their sums (pass 1) or squared residuals (pass 2). B: this
// thread's bins.
void sweep_block(const Sweep& w, int pass, int64_t blk, Bins* B, LanePart* part) {
  const StructureSpec& s = w.s;
  const float *x = w.x, *y = w.y;
  const int64_t R = w.R, H = w.H, C = w.C, CC = w.CC, NC = w.NC, block_rows = w.block_rows;
  const bool lanes = w.lanes;
  const int lo = w.lo;
  std::vector<Sums>& totals = w.totals;
  const std::vector<double>&cb_scale = w.cb_scale, &cb_off = w.cb_off, &cb_sm = w.cb_sm, &crms = w.crms, &cw = w.cw;
  for (int64_t r = blk * block_rows; r < std::min(R, (blk + 1) * block_rows); ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t q = 0; q < NC; ++q) {
        const int64_t base = (r * H + h) * C, c0 = q * CC, c1 = std::min(C, c0 + CC);
        const float* g = s.sm_dir ? s.sm_dir + base : nullptr;
        Sums t;
        if (lanes) {
          if (g) cluster_bins<true>(x + base, y + base, g, c0, c1, *B);
          else cluster_bins<false>(x + base, y + base, g, c0, c1, *B);
          if (pass == 2) {
            t = totals[size_t((r * H + h) * NC + q)];  // pass 1's, from the same bins
          } else if (g) {
            for (int j = 0; j < 128; ++j) {
              t.n += B->n[j]; t.sxx += B->sxx[j]; t.sxe += B->sxe[j]; t.se += B->se[j]; t.sgg += B->sgg[j]; t.sge += B->sge[j];
            }
          } else {  // sgg and sge are zeros: their sums stay +0
            for (int j = 0; j < 128; ++j) {
              t.n += B->n[j]; t.sxx += B->sxx[j]; t.sxe += B->sxe[j]; t.se += B->se[j];
            }
          }
        } else {
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t i = base + c;
            if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
            const double xv = x[i], e = double(y[i]) - double(x[i]), gv = g ? double(g[c]) : 0.0;
            t.n += 1; t.sxx += xv * xv; t.sxe += xv * e; t.se += e; t.sgg += gv * gv; t.sge += gv * e;
          }
        }
        if (s.sm_sums) {  // the direction given as its cluster sums (sm_cluster_sums)
          t.sgg = s.sm_sums[2 * ((r * H + h) * NC + q)];
          t.sge = s.sm_sums[2 * ((r * H + h) * NC + q) + 1];
        }
        if (pass == 1) totals[size_t((r * H + h) * NC + q)] = t;
        if (!part || t.n == 0) continue;
        // The column classes of every modulus tested. A class without finite pairs adds
        // zeros (no change) and is not counted.
        if (pass == 1) {
          Bins& S = part->s;
          for (int j = lo; j < kClasses; ++j) {
            S.n[j] += B->n[j]; S.sxx[j] += B->sxx[j]; S.sxe[j] += B->sxe[j];
            S.se[j] += B->se[j]; S.sgg[j] += B->sgg[j]; S.sge[j] += B->sge[j];
            part->clusters[j] += B->n[j] > 0 ? 1.0 : 0.0;
          }
        } else {
          const double *bs = cb_scale.data(), *bo = cb_off.data(), *bg = cb_sm.data(), *rm = crms.data();
          const double *wx = cw.data(), *wn = wx + kClasses, *wg = wn + kClasses;
          for (int j = lo; j < kClasses; ++j) {
            const double n = B->n[j];
            const double us = (B->sxe[j] - bs[j] * B->sxx[j]) * jack(B->sxx[j], wx[j]);
            const double uo = rm[j] * (B->se[j] - bo[j] * rm[j] * n) * jack(n, wn[j]);
            const double ug = (B->sge[j] - bg[j] * B->sgg[j]) * jack(B->sgg[j], wg[j]);
            const bool has = n > 0;
            part->v_scale[j] += has ? us * us : 0.0;
            part->v_off[j] += has ? uo * uo : 0.0;
            part->v_sm[j] += has ? ug * ug : 0.0;
            part->w2_scale[j] += B->sxx[j] * B->sxx[j];
            part->w2_off[j] += n * n;
            part->w2_sm[j] += B->sgg[j] * B->sgg[j];
          }
        }
      }
}

// The blocks' column-class parts added in block order, then given to the column-class groups:
// their sums and coefficients (pass 1; packed into cb_* for pass 2) or their variances (pass 2).
void combine_lane_parts(int pass, const std::vector<LanePart>& parts, int lo, const std::vector<Kind>& kinds,
                        std::vector<std::vector<GroupAcc>>& acc, std::vector<double>& cb_scale, std::vector<double>& cb_off,
                        std::vector<double>& cb_sm, std::vector<double>& crms, std::vector<double>& cw) {
  // The blocks' column-class parts, in block order.
  LanePart sum{};
  for (const LanePart& p : parts)
    for (int j = lo; j < kClasses; ++j) {
      if (pass == 1) {
        sum.s.n[j] += p.s.n[j]; sum.s.sxx[j] += p.s.sxx[j]; sum.s.sxe[j] += p.s.sxe[j];
        sum.s.se[j] += p.s.se[j]; sum.s.sgg[j] += p.s.sgg[j]; sum.s.sge[j] += p.s.sge[j];
        sum.clusters[j] += p.clusters[j];
      } else {
        sum.v_scale[j] += p.v_scale[j]; sum.v_off[j] += p.v_off[j]; sum.v_sm[j] += p.v_sm[j];
        sum.w2_scale[j] += p.w2_scale[j]; sum.w2_off[j] += p.w2_off[j]; sum.w2_sm[j] += p.w2_sm[j];
      }
    }
  for (size_t k = 0; k < kinds.size(); ++k) {
    const Kind& K = kinds[k];
    if (!K.modulus) continue;
    const int at = kFoldAt[fold_of(K.modulus)];
    for (int64_t j = 0; j < K.modulus; ++j) {
      GroupAcc& a = acc[k][size_t(j)];
      const size_t i = size_t(at + j);
      if (pass == 1) {
        a.s = {sum.s.n[i], sum.s.sxx[i], sum.s.sxe[i], sum.s.se[i], sum.s.sgg[i], sum.s.sge[i]};
        a.clusters = int64_t(sum.clusters[i]);
        a.coefficients();
        cb_scale[i] = a.b_scale; cb_off[i] = a.b_off; cb_sm[i] = a.b_sm; crms[i] = a.rms;
        cw[i] = a.s.sxx; cw[kClasses + i] = a.s.n; cw[2 * kClasses + i] = a.s.sgg;
      } else {
        a.v_scale = sum.v_scale[i]; a.v_off = sum.v_off[i]; a.v_sm = sum.v_sm[i];
        a.w2_scale = sum.w2_scale[i]; a.w2_off = sum.w2_off[i]; a.w2_sm = sum.w2_sm[i];
      }
    }
  }
}

// Every group's scale and offset tests (and the whole tensor's softmax-direction test when the spec
// gives the direction), in report order, from the groups' sums, coefficients and variances.
std::vector<GroupTest> group_tests(const StructureSpec& s, const std::vector<Kind>& kinds,
                                   const std::vector<std::vector<GroupAcc>>& acc) {
  std::vector<GroupTest> tests;
  // w2: the clusters' weights squared, summed, in the units of sdd (its own clusters' parts).
  auto test = [&](const std::string& stat, size_t k, size_t g, double b, double sdd, double var, double w2) {
    const GroupAcc& a = acc[k][g];
    GroupTest t;
    t.stat = stat;
    t.kind = kinds[k].name;
    t.index = int64_t(g);
    t.label = label(kinds[k], int64_t(g), s);
    t.n = int64_t(a.s.n);
    t.clusters = a.clusters;
    t.b = b;
    t.explained = b * b * sdd;
    t.floor = s.floor;
    t.tested = a.clusters >= kMinClusters && sdd > 0;
    t.dof = effective_dof(a.clusters, sdd, w2);
    if (a.clusters >= 2 && sdd > 0) {
      t.se = std::sqrt(double(a.clusters) / double(a.clusters - 1) * var) / sdd;
      t.t = t.se > 0 ? t.b / t.se : (t.b == 0 ? 0.0 : std::copysign(std::numeric_limits<double>::infinity(), t.b));
    }
    tests.push_back(t);
  };
  for (size_t k = 0; k < kinds.size(); ++k)
    for (size_t g = 0; g < acc[k].size(); ++g) {
      const GroupAcc& a = acc[k][g];
      test("scale", k, g, a.b_scale, a.s.sxx, a.v_scale, a.w2_scale);
      test("offset", k, g, a.b_off, a.rms * a.rms * a.s.n, a.v_off, a.rms * a.rms * a.rms * a.rms * a.w2_off);
    }
  if (s.sm_dir || s.sm_sums) test("sm", 0, 0, acc[0][0].b_sm, acc[0][0].s.sgg, acc[0][0].v_sm, acc[0][0].w2_sm);
  return tests;
}

}  // namespace

// Pass 1 sweeps over the clusters: each cluster's pairs are summed (with column classes: into 128
// bins by column mod 128, folded in pairs into the bins mod 64, 32, 16 and 8; the cluster's total
// is the bins' sum in bin order), the cluster's total is kept, and its bins go to the column-class
// groups. Then every other kind's groups take the cluster totals, cluster by cluster in order
// (no second sweep over the data). Pass 2 (only with column classes) sweeps again for the
// column-class groups' squared cluster residuals; the other kinds' come from the kept totals.
// Order: the sweeps run over fixed blocks of whole rows (kBlockElements elements or more each; the
// partition depends only on the shape), in parallel; a column-class group's sums are accumulated
// within a block cluster by cluster, then the blocks' parts are added in block order. Every other
// sum is accumulated cluster by cluster in order. So the report's every bit is the same for any
// thread count.
StructureReport structure_tests(const StructureSpec& s, const float* x, const float* y) {
  const int64_t R = s.rows, H = s.heads, C = s.cols, CC = std::max<int64_t>(1, s.cluster_cols);
  require(s.row_seq.empty() || int64_t(s.row_seq.size()) == R, "structure_tests: row_seq size");
  std::vector<Kind> kinds = structure_kinds(s);
  const bool lanes = std::any_of(kinds.begin(), kinds.end(), [](const Kind& k) { return k.modulus > 0; });
  // The column classes tested: [kFoldAt[f0], kClasses) covers every modulus from the largest tested down to 8.
  int64_t m_max = 0;
  for (const Kind& K : kinds) m_max = std::max(m_max, K.modulus);
  const int lo = lanes ? kFoldAt[fold_of(m_max)] : kClasses;

  std::vector<std::vector<GroupAcc>> acc(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) acc[k].resize(size_t(kinds[k].n_groups));
  StructureReport rep;
  const int64_t NC = (C + CC - 1) / CC;  // clusters per (row, head)
  const int64_t row_elems = std::max<int64_t>(1, H * C);
  const int64_t block_rows = std::max<int64_t>(1, (kBlockElements + row_elems - 1) / row_elems);
  const int64_t blocks = (R + block_rows - 1) / block_rows;
  std::vector<Sums> totals(size_t(R * H * NC));                 // every cluster's sums, in cluster order
  std::vector<LanePart> parts(lanes ? size_t(blocks) : 0);      // the column classes, per block
  // The column-class groups' coefficients for pass 2, packed as the classes.
  std::vector<double> cb_scale(kClasses), cb_off(kClasses), cb_sm(kClasses), crms(kClasses), cw(3 * kClasses);
  const Sweep w{s, x, y, R, H, C, CC, NC, block_rows, lanes, lo, totals, cb_scale, cb_off, cb_sm, crms, cw};
  for (int pass = 1; pass <= (lanes ? 2 : 1); ++pass) {
#pragma omp parallel if (blocks > 1)
    {
      auto B = std::make_unique<Bins>();
#pragma omp for schedule(static)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        LanePart* part = lanes ? &parts[size_t(blk)] : nullptr;
        if (part) *part = LanePart{};
        sweep_block(w, pass, blk, B.get(), part);
      }
    }
    combine_lane_parts(pass, parts, lo, kinds, acc, cb_scale, cb_off, cb_sm, crms, cw);
    if (pass > 1) continue;
    // Every other kind from the cluster totals, cluster by cluster in order.
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t q = 0; q < NC; ++q) {
          const Sums& t = totals[size_t((r * H + h) * NC + q)];
          if (t.n == 0) continue;
          for (size_t k = 0; k < kinds.size(); ++k)
            if (!kinds[k].modulus) {
              GroupAcc& a = acc[k][size_t(group_of(kinds[k], s.row_seq, r, h))];
              a.s.add(t);
              ++a.clusters;
            }
        }
    for (size_t k = 0; k < kinds.size(); ++k)
      if (!kinds[k].modulus)
        for (GroupAcc& a : acc[k]) a.coefficients();
  }
  // Every other kind's variances from the cluster totals, in order; the report's clusters.
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t q = 0; q < NC; ++q) {
        const Sums& t = totals[size_t((r * H + h) * NC + q)];
        if (t.n == 0) continue;
        rep.clusters.push_back({t.n, t.sxx, t.sxe, t.se});
        for (size_t k = 0; k < kinds.size(); ++k)
          if (!kinds[k].modulus) acc[k][size_t(group_of(kinds[k], s.row_seq, r, h))].residual(t);
      }
  totals = std::vector<Sums>();

  std::vector<GroupTest> tests = group_tests(s, kinds, acc);
  rep.tests = std::move(tests);
  std::vector<std::string> kind_names;
  for (const Kind& K : kinds) kind_names.push_back(K.name);
  finish(rep, s, kind_names, x, y);
  return rep;
}

namespace {

// Thresholds, flags and findings of a report whose tests are computed (x, y: the tensors, when the
// report has them; the softmax-scale finding is checked against their error's sum of squares).
void finish(StructureReport& rep, const StructureSpec& s, const std::vector<std::string>& kinds, const float* x,
            const float* y) {
  // Thresholds: Bonferroni over the tests run.
  rep.m = 0;
  rep.max_ratio = -kRatioCap;
  for (const GroupTest& t : rep.tests) rep.m += t.tested;
  std::map<int64_t, double> t_crit;  // by degrees of freedom: groups of a kind mostly share theirs
  for (GroupTest& t : rep.tests) {
    if (!t.tested) continue;
    auto it = t_crit.find(t.dof);
    if (it == t_crit.end()) it = t_crit.emplace(t.dof, t_upper_quantile(kStructureAlpha / (2.0 * double(rep.m)), t.dof)).first;
    t.t_crit = it->second;
    t.flagged = t.ratio() > 1;
    rep.flagged = rep.flagged || t.flagged;
    rep.max_ratio = std::max(rep.max_ratio, t.ratio());
    rep.max_b_over_floor = std::max(rep.max_b_over_floor, std::fabs(t.b) / t.floor);
    rep.max_t_over_crit = std::max(rep.max_t_over_crit, std::fabs(t.t) / t.t_crit);
  }
  // Diagnoses, per statistic: the smallest set of groups of one kind that holds the error (the
  // other groups of that kind show nothing: no |t| > 3 with half the weakest flagged effect),
  // preferring fewer groups, then the finer kind; else "every element" when the whole tensor is
  // flagged; else the flagged groups as they are.
  auto by = [&](const std::string& stat, const std::string& kind) {
    std::vector<const GroupTest*> v;
    for (const GroupTest& t : rep.tests) if (t.stat == stat && t.kind == kind) v.push_back(&t);
    return v;
  };
  auto describe = [&](const GroupTest& t, const std::string& where) {
    char buf[400];
    if (t.stat == "scale")
      std::snprintf(buf, sizeof buf, "%s scale error %.6f (+-%.2g) over %s: %s", s.tensor.c_str(),
                    1 + t.b, t.se, where.c_str(), s.scale_meaning.c_str());
    else if (t.stat == "offset")
      std::snprintf(buf, sizeof buf, "%s offset %+.3g rms (+-%.2g) over %s: an additive error (a bias or a missing or extra term)",
                    s.tensor.c_str(), t.b, t.se, where.c_str());
    else
      std::snprintf(buf, sizeof buf, "%s matches a softmax scale off by %+.4f%% (+-%.2g%%): sm_scale (or its log2(e) folding) is wrong",
                    s.tensor.c_str(), 100 * t.b, 100 * t.se);
    return std::string(buf);
  };
  // A fitted direction is a fair lead when it explains kWholeExplains of the error, or when what it
  // leaves is no more than a bf16 rounding of the values (kRoundingResidual): a 0.1% scale on a bf16
  // output explains only a fifth of its error, the rest being the output's own rounding.
  auto fits = [](double explained, double err_ss, double val_ss) {
    return explained >= kWholeExplains * err_ss || err_ss - explained <= kRoundingResidual * kRoundingResidual * val_ss;
  };
  // The error's sum of squares over the groups `in` of kind `name` ("whole", {0}: every element), in
  // element order; vals receives the values' (computed only when a finding needs them).
  auto error_ss_in = [&](const std::string& name, const std::set<int64_t>& in, double& vals) {
    Kind K;
    for (const Kind& k : structure_kinds(s))
      if (k.name == name) K = k;
    double sum = 0;
    vals = 0;
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t c = 0; c < s.cols; ++c) {
          const int64_t i = (r * s.heads + h) * s.cols + c;
          if (!finite_f32(x[i]) || !finite_f32(y[i]) || !in.count(K.modulus ? c % K.modulus : group_of(K, s.row_seq, r, h))) continue;
          sum += (double(y[i]) - double(x[i])) * (double(y[i]) - double(x[i]));
          vals += double(x[i]) * x[i];
        }
    return sum;
  };
  auto any_flag = [&](const std::string& stat) {
    return std::any_of(rep.tests.begin(), rep.tests.end(), [&](const GroupTest& t) { return t.stat == stat && t.flagged; });
  };
  // Scale and offset are nearly collinear where the golden values share a sign (lse): when both
  // flag somewhere, only the one whose whole-tensor fit explains more of the error is described.
  std::string only;
  bool confined = false;
  if (any_flag("scale") && any_flag("offset"))
    only = by("scale", "whole")[0]->explained >= by("offset", "whole")[0]->explained ? "scale" : "offset";
  for (const std::string stat : {"scale", "offset"}) {
    const std::vector<const GroupTest*> whole = by(stat, "whole");
    if (!any_flag(stat) || (!only.empty() && stat != only)) continue;
    struct Cand { size_t n_flag, n_groups; std::vector<const GroupTest*> f; std::string kind; };
    std::vector<Cand> cands;
    for (const std::string& K : kinds) {
      if (K == "whole") continue;
      const auto v = by(stat, K);
      Cand c{0, v.size(), {}, K};
      double smallest = std::numeric_limits<double>::infinity();
      for (const GroupTest* t : v)
        if (t->flagged) { ++c.n_flag; c.f.push_back(t); smallest = std::min(smallest, std::fabs(t->b)); }
      // The rest must be tested and show at most half the effect of the weakest flagged group (or
      // nothing significant): an error spread everywhere near the floor flags some groups by chance,
      // and an untested group proves nothing.
      bool clean_rest = true;
      for (const GroupTest* t : v)
        if (!t->flagged && (!t->tested || (std::fabs(t->b) >= 0.5 * smallest && std::fabs(t->t) > 3))) clean_rest = false;
      // At most half the groups: 15 column classes of 16 is no confinement, only the error nearly
      // everywhere with one class by chance quieter.
      // A run of row tiles to the end stays a place ("rows from 64 on": a kernel wrong beyond a position).
      const bool run_to_end = K.rfind("rows", 0) == 0 && c.n_flag > 0 && c.f.back()->index == int64_t(c.n_groups) - 1 &&
                              c.f.back()->index - c.f.front()->index + 1 == int64_t(c.n_flag);
      if (c.n_flag > 0 && (2 * c.n_flag <= c.n_groups || run_to_end) && c.n_flag < c.n_groups && clean_rest) cands.push_back(std::move(c));
    }
    std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
      return a.n_flag != b.n_flag ? a.n_flag < b.n_flag : a.n_groups > b.n_groups;
    });
    if (!cands.empty()) {
      const Cand& c = cands[0];
      std::string where;
      for (size_t i = 0; i < c.f.size(); ++i) where += (i ? ", " : "") + c.f[i]->label;
      // Several row tiles in one run: the rows they span ("rows from 256 on" when the run ends the
      // tensor: a kernel that goes wrong beyond a position).
      const int64_t tile = c.kind.rfind("rows", 0) == 0 ? std::stoll(c.kind.substr(4)) : 0;  // "rows64", "rows128"
      if (tile && c.f.size() >= 2 && c.f.back()->index - c.f.front()->index + 1 == int64_t(c.f.size()) && s.row_ids.empty()) {
        const int64_t a = c.f.front()->index * tile, b = std::min(s.rows, (c.f.back()->index + 1) * tile) - 1;
        where = b == s.rows - 1 ? "rows from " + std::to_string(a) + " on" : "rows " + std::to_string(a) + "-" + std::to_string(b);
      }
      const GroupTest* big = *std::max_element(c.f.begin(), c.f.end(), [](const GroupTest* a, const GroupTest* b) { return std::fabs(a->b) < std::fabs(b->b); });
      // Named when the groups' fits are a fair share of the error inside them (as over every element).
      double explained = 0;
      std::set<int64_t> in;
      for (const GroupTest* t : c.f) explained += t->explained, in.insert(t->index);
      double vals = 0;
      const double err = x && y ? error_ss_in(c.kind, in, vals) : 0;
      if (!x || !y || fits(explained, err, vals))
        rep.findings.push_back(describe(*big, where + (c.n_flag == 1 ? " only" : " only (" + std::to_string(c.n_flag) + " of " + std::to_string(c.n_groups) + ")")));
      confined = true;
    } else if (whole[0]->flagged) {
      // Over every element a scale or an offset is named only when it is a fair share of the error
      // (kWholeExplains); otherwise the tensor fails unnamed.
      double vals = 0;
      const double err = x && y ? error_ss_in("whole", {0}, vals) : 0;
      if (!x || !y || fits(whole[0]->explained, err, vals)) rep.findings.push_back(describe(*whole[0], "every element"));
    } else {
      std::string where;
      const GroupTest* big = nullptr;
      for (const GroupTest& t : rep.tests)
        if (t.stat == stat && t.flagged) {
          where += (where.empty() ? "" : ", ") + t.label;
          if (!big || std::fabs(t.b) > std::fabs(big->b)) big = &t;
        }
      rep.findings.push_back(describe(*big, where));
    }
  }
  // The softmax-scale direction replaces that finding when it is flagged, the error is not
  // confined to some groups, and it explains more than the whole-tensor scale or offset.
  GroupTest* sm = nullptr;
  for (GroupTest& t : rep.tests) if (t.stat == "sm" && t.flagged) sm = &t;
  if (!sm || confined) return;
  for (const std::string stat : {"scale", "offset"})
    if ((only.empty() || stat == only) && any_flag(stat) && by(stat, "whole")[0]->explained > sm->explained) return;
  // A wrong softmax scale moves every value along its direction and nothing else: its test fits only
  // when that direction explains most of the error (kSmExplains of its sum of squares, the rest
  // being the contract's rounding). Random error whose square has a small bias (bf16 q.k products
  // raise every lse a little: logsumexp is convex) flags the direction by its size alone; it is no
  // softmax scale, and the direction is then not named.
  if (x && y) {
    double vals = 0;
    if (sm->explained < kSmExplains * error_ss_in("whole", {0}, vals)) {
      sm->fits = false;
      // The scale or offset found above explains less than this direction: no fairer a lead.
      rep.findings.clear();
      return;
    }
  }
  rep.findings.assign(1, describe(*sm, "every element"));
}

}  // namespace


// A pair left out (x or y not finite) adds +0 to both sums, which leaves them as they were: they
// start at +0 and never become -0 (in round to nearest a sum that reaches zero from +0 is +0), so
// the loop needs no branch. Clusters are independent: OpenMP over them gives the same bits for
// any thread count.
void sm_cluster_sums(const float* x, const float* y, const float* g, int64_t clusters, int64_t cols, double* out) {
#pragma omp parallel for schedule(static) if (clusters * cols >= (int64_t(1) << 16))
  for (int64_t c = 0; c < clusters; ++c) {
    double sgg = 0, sge = 0;
    for (int64_t j = c * cols; j < (c + 1) * cols; ++j) {
      const bool pair = finite_f32(x[j]) && finite_f32(y[j]);
      const double gv = pair ? double(g[j]) : 0.0;
      const double e = pair ? double(y[j]) - double(x[j]) : 0.0;
      sgg += gv * gv;
      sge += gv * e;
    }
    out[2 * c] = sgg;
    out[2 * c + 1] = sge;
  }
}

StructureReport pooled_tests(const StructureSpec& s, const std::vector<ClusterSums>& clusters) {
  StructureReport rep;
  rep.clusters = clusters;
  double n = 0, sxx = 0;
  for (const ClusterSums& c : clusters) { n += c.n; sxx += c.sxx; }
  const double rms = n > 0 ? std::sqrt(sxx / n) : 0.0;
  for (const std::string stat : {"scale", "offset"}) {
    // d = x (scale) or d = rms (offset): sum d^2, sum d e and the cluster sums of d (e - b d).
    double sdd = 0, sde = 0;
    for (const ClusterSums& c : clusters) {
      sdd += stat == "scale" ? c.sxx : c.n * rms * rms;
      sde += stat == "scale" ? c.sxe : rms * c.se;
    }
    GroupTest t;
    t.stat = stat;
    t.kind = "whole";
    t.label = "every element";
    t.floor = s.floor;
    t.clusters = int64_t(clusters.size());
    t.n = int64_t(n);
    t.b = sdd > 0 ? sde / sdd : 0.0;
    t.explained = t.b * t.b * sdd;
    double var = 0, w2 = 0;
    for (const ClusterSums& c : clusters) {
      const double u = stat == "scale" ? (c.sxe - t.b * c.sxx) * jack(c.sxx, sdd) : rms * (c.se - t.b * rms * c.n) * jack(c.n, n);
      const double w = stat == "scale" ? c.sxx : c.n * rms * rms;
      var += u * u;
      w2 += w * w;
    }
    t.tested = t.clusters >= kMinClusters && sdd > 0;
    t.dof = effective_dof(t.clusters, sdd, w2);
    if (t.clusters >= 2 && sdd > 0) {
      t.se = std::sqrt(double(t.clusters) / double(t.clusters - 1) * var) / sdd;
      t.t = t.se > 0 ? t.b / t.se : (t.b == 0 ? 0.0 : std::copysign(std::numeric_limits<double>::infinity(), t.b));
    }
    rep.tests.push_back(t);
  }
  finish(rep, s, {"whole"});
  return rep;
}

void summarize(const StructureReport& st, Report& r) {
  r.structure_tests = st.m;
  r.structure_max_ratio = st.max_ratio;
  r.structure_max_b_over_floor = st.max_b_over_floor;
  for (const GroupTest& t : st.tests)
    if (t.flagged) r.structure_flagged.push_back({t.stat, t.kind, t.label, t.b, t.se, t.t, t.t_crit, t.floor, t.clusters, t.fits});
  r.findings = st.findings;
}

Report compare_structured(const std::string& tensor, const Tensor<float>& expected, const Tensor<float>& got,
                          const FloatRule& rule, const StructureSpec& spec, StructureReport* out) {
  Report r = compare_floats(tensor, expected, got, rule);
  if (expected.shape != got.shape) return r;
  require(spec.rows * spec.heads * spec.cols == expected.numel(), "compare_structured " + tensor + ": spec does not cover the tensor");
  StructureReport st = structure_tests(spec, expected.ptr(), got.ptr());
  summarize(st, r);
  if (st.flagged) {
    r.verdict = Verdict::fail;
    r.reasons.push_back(std::to_string(r.structure_flagged.size()) + " structure test(s) flagged a systematic error (" +
                        std::to_string(st.m) + " run; judge/structure.h)");
  }
  if (out) *out = std::move(st);
  return r;
}

}  // namespace indexshare::cmp
