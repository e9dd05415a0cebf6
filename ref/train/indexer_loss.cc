#include "ref/train/indexer_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ref/error.h"
#include "ref/indexer.h"
#include "ref/numerics.h"

namespace indexshare::ref::train {

Target parse_target(const std::string& name) {
  if (name == "own-layer") return Target::own_layer;
  if (name == "served-layers") return Target::served_layers;
  throw Error("indexer loss target: unknown name '" + name + "' (own-layer or served-layers)");
}

std::string target_name(Target t) { return t == Target::own_layer ? "own-layer" : "served-layers"; }

KlForm parse_kl_form(const std::string& name) {
  if (name == "kl-of-mean") return KlForm::kl_of_mean;
  if (name == "mean-of-kl") return KlForm::mean_of_kl;
  throw Error("indexer loss kl_form: unknown name '" + name + "' (kl-of-mean or mean-of-kl)");
}

std::string kl_form_name(KlForm f) { return f == KlForm::kl_of_mean ? "kl-of-mean" : "mean-of-kl"; }

namespace detail {

namespace {

constexpr double kEps = 1e-10;  // Megatron's INDEXER_LOSS_EPS

// q . k with d ascending (the indexer's order, ref/indexer.h).
double dot_seq(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// q . k in the 8-part order of ref/attention.h (the teacher's attention logits).
double dot8(const std::vector<double>& q, const bf16_t* k) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t d = 0; d < q.size(); ++d) part[d % 8] += q[d] * double(bf16_to_f32(k[d]));
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

void check_finite(const std::vector<double>& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i)
    require(std::isfinite(v[i]), what + ": non-finite value at flat index " + std::to_string(i));
}

void check_teachers(const std::vector<TeacherLayer>& teachers, int64_t s_q, int64_t s_kv, Target target) {
  require(!teachers.empty(), "indexer loss teachers: at least one teacher layer is needed");
  require(target == Target::served_layers || teachers.size() == 1,
          "indexer loss teachers: own-layer takes exactly one layer, got " + std::to_string(teachers.size()));
  for (size_t j = 0; j < teachers.size(); ++j) {
    const TeacherLayer& L = teachers[j];
    const std::string n = "indexer loss teacher " + std::to_string(j);
    require(L.q && L.kv, n + ": q and kv are required");
    require(L.q->rank() == 3 && L.q->dim(0) == s_q,
            n + " q: expected [s_q=" + std::to_string(s_q) + ", h_q, d_qk], got " + shape_str(L.q->shape));
    require(L.kv->rank() == 3 && L.kv->dim(0) == s_kv && L.kv->dim(1) == 1 && L.kv->dim(2) == L.q->dim(2),
            n + " kv: expected [s_kv=" + std::to_string(s_kv) + ", 1, " + std::to_string(L.q->dim(2)) + "], got " +
                shape_str(L.kv->shape));
    require(std::isfinite(L.scale), n + " scale: not finite");
    if (L.non_compressed_lse) {
      require_shape(*L.non_compressed_lse, {s_q, L.q->dim(1)}, n + " non_compressed_lse");
      for (int64_t i = 0; i < L.non_compressed_lse->numel(); ++i)
        require(!std::isnan((*L.non_compressed_lse)[i]), n + " non_compressed_lse: NaN at flat index " + std::to_string(i));
    }
  }
}

// R(t): the valid keys, or the top-k entries inside the window (each once), ascending.
std::vector<int64_t> support(int64_t t, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                             const Tensor<int32_t>* topk) {
  std::vector<int64_t> r;
  if (!topk) {
    for (int64_t s = ks[t]; s < ke[t]; ++s) r.push_back(s);
    return r;
  }
  const int64_t width = ke[t] - ks[t];
  for (int64_t j = 0; j < topk->dim(1); ++j) {
    const int64_t local = topk->at(t, j);
    if (local >= 0 && local < width) r.push_back(ks[t] + local);
  }
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

// One teacher layer's normalized p over R(t) (the header's "teacher" step).
std::vector<double> teacher_row(const TeacherLayer& L, int64_t t, const std::vector<int64_t>& R) {
  const int64_t h_q = L.q->dim(1), d_qk = L.q->dim(2);
  std::vector<double> acc(R.size(), 0.0), P(R.size()), qd(static_cast<size_t>(d_qk));
  if (R.empty()) return acc;
  for (int64_t h = 0; h < h_q; ++h) {
    for (int64_t d = 0; d < d_qk; ++d) qd[size_t(d)] = bf16_to_f32(L.q->at(t, h, d));
    double m = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < R.size(); ++i) {
      P[i] = dot8(qd, L.kv->ptr() + R[i] * d_qk) * double(L.scale);
      m = std::max(m, P[i]);
    }
    double l = 0.0;
    for (size_t i = 0; i < R.size(); ++i) l += (P[i] = exp_portable(P[i] - m));
    double mass = 1.0;  // the share of the head's softmax that falls on R
    if (L.non_compressed_lse) {
      const double lse_r = m + std::log(l);
      mass = exp_portable(lse_r - logaddexp(double(L.non_compressed_lse->at(t, h)), lse_r));
    }
    for (size_t i = 0; i < R.size(); ++i) acc[i] += (P[i] / l) * mass;
  }
  double sum = 0.0;
  for (double a : acc) sum += a;
  const double denom = L.non_compressed_lse ? (sum > 0.0 ? sum : 1.0) : std::max(sum, kEps);
  for (double& a : acc) a /= denom;
  return acc;
}

// The target over R(t): own-layer, or the mean over the served layers (j ascending). p_each
// receives each teacher's row.
std::vector<double> target_row(const LossContext& c, int64_t t, const std::vector<int64_t>& R, std::vector<std::vector<double>>& p_each) {
  p_each.assign(1, teacher_row((*c.teachers)[0], t, R));
  std::vector<double> p = p_each[0];
  if (c.o.target == Target::own_layer) return p;
  for (size_t j = 1; j < c.teachers->size(); ++j) {
    p_each.push_back(teacher_row((*c.teachers)[j], t, R));
    for (size_t i = 0; i < R.size(); ++i) p[i] += p_each[j][i];
  }
  for (double& v : p) v /= double(c.teachers->size());
  return p;
}

// I[t, s] for one key (the header's "scores" step); S_col, when given, receives S[h, s] of every head.
double score_at(const LossContext& c, int64_t t, int64_t s, std::vector<double>* S_col) {
  double acc = 0.0;
  for (int64_t h = 0; h < c.H; ++h) {
    const double dot = dot_seq(&c.q[size_t((t * c.H + h) * c.D)], &c.k[size_t(s * c.D)], c.D);
    if (S_col) (*S_col)[size_t(h)] = dot;
    const double act = c.o.relu ? (dot > 0.0 ? dot : 0.0) : dot;
    const double term = c.w[size_t(t * c.H + h)] * act;
    acc = acc + term;
  }
  return acc;
}

}  // namespace

double logaddexp(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double m = std::max(a, b);
  if (std::isinf(m)) return m;
  return m + std::log1p(exp_portable(-std::fabs(a - b)));
}

double head_score(const LossContext& c, int64_t t, int64_t h, int64_t s) {
  return dot_seq(&c.q[size_t((t * c.H + h) * c.D)], &c.k[size_t(s * c.D)], c.D);
}

LossContext prepare(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w, const Tensor<int32_t>& ks,
                    const Tensor<int32_t>& ke, const Tensor<int32_t>* topk, const std::vector<TeacherLayer>& teachers,
                    const IndexerLossOptions& o, IndexerLossOut& out) {
  const Tensor<float> unit_scale({k.rank() == 2 ? k.dim(0) : 0}, 1.0f);
  check_indexer_inputs(q.shape, k.shape, unit_scale, w, ks, ke);
  LossContext c;
  c.s_q = q.dim(0), c.H = q.dim(1), c.D = q.dim(2), c.s_kv = k.dim(0);
  c.ks = &ks, c.ke = &ke, c.teachers = &teachers, c.o = o;
  check_teachers(teachers, c.s_q, c.s_kv, o.target);
  if (o.sparse) {
    require(topk != nullptr, "indexer loss topk: required by the sparse loss");
    require(topk->rank() == 2 && topk->dim(0) == c.s_q && topk->dim(1) >= 1,
            "indexer loss topk: expected [s_q=" + std::to_string(c.s_q) + ", topk >= 1], got " + shape_str(topk->shape));
  }
  c.q.assign(q.ptr(), q.ptr() + q.numel());
  c.k.assign(k.ptr(), k.ptr() + k.numel());
  c.w.assign(w.ptr(), w.ptr() + w.numel());
  check_finite(c.q, "indexer loss q");
  check_finite(c.k, "indexer loss k");
  check_finite(c.w, "indexer loss weights");
  require(std::isfinite(o.loss_coeff) && std::isfinite(o.grad), "indexer loss options: loss_coeff and grad must be finite");
  int64_t valid = 0;
  for (int64_t t = 0; t < c.s_q; ++t) {
    c.rows.push_back(support(t, ks, ke, o.sparse ? topk : nullptr));
    if (ke[t] > ks[t]) ++valid;
  }
  out.n_rows = std::max<int64_t>(o.all_rows ? c.s_q : valid, 1);
  c.g = o.per_token ? o.grad * o.loss_coeff : (o.grad * o.loss_coeff) / double(out.n_rows);
  c.dI.assign(size_t(c.s_q * c.s_kv), 0.0);
  c.kl.assign(size_t(c.s_q), 0.0);
  out.scores = Tensor<float>({c.s_q, c.s_kv}, -std::numeric_limits<float>::infinity());
  out.p = Tensor<float>({c.s_q, c.s_kv}, 0.0f);
  out.log_q = Tensor<float>({c.s_q, c.s_kv}, 0.0f);
  out.kl = Tensor<float>({c.s_q}, 0.0f);
  out.d_scores = Tensor<float>({c.s_q, c.s_kv}, 0.0f);
  out.dq = Tensor<float>({c.s_q, c.H, c.D}, 0.0f);
  out.dk = Tensor<float>({c.s_kv, c.D}, 0.0f);
  out.dw = Tensor<float>({c.s_q, c.H}, 0.0f);
  return c;
}

void apply_kl_form(LossContext& c, int64_t t, const std::vector<std::vector<double>>& p_each, const std::vector<double>& p,
                   IndexerLossOut& out) {
  if (c.o.kl_form != KlForm::mean_of_kl || p_each.size() < 2) return;
  double each = 0.0, mean = 0.0;
  for (const std::vector<double>& pj : p_each)
    for (double v : pj) each += v * std::log(std::max(v, kEps));
  for (double v : p) mean += v * std::log(std::max(v, kEps));
  c.kl[size_t(t)] += each / double(p_each.size()) - mean;
  out.kl[t] = float(c.kl[size_t(t)]);
}

void kl_and_d_scores(LossContext& c, int64_t t, const double* I, int64_t lo, const std::vector<double>& p,
                     const std::vector<double>& e, double l, double lse, IndexerLossOut& out) {
  const std::vector<int64_t>& R = c.rows[size_t(t)];
  double kl = 0.0, psum = 0.0;
  for (size_t i = 0; i < R.size(); ++i) {
    const double log_q = I[size_t(R[i] - lo)] - lse;
    kl += p[i] * (std::log(std::max(p[i], kEps)) - log_q);
    psum += p[i];
    out.p.at(t, R[i]) = float(p[i]);
    out.log_q.at(t, R[i]) = float(log_q);
  }
  c.kl[size_t(t)] = kl;
  out.kl[t] = float(kl);
  for (size_t i = 0; i < R.size(); ++i) {
    const double dI = c.g * ((e[i] / l) * psum - p[i]);
    c.dI[size_t(t * c.s_kv + R[i])] = dI;
    out.d_scores.at(t, R[i]) = float(dI);
  }
}

void loss_row(LossContext& c, int64_t t, IndexerLossOut& out) {
  const int64_t H = c.H, D = c.D, s_kv = c.s_kv;
  // 1. I over the window (the indexer's output), in double.
  std::vector<double> I(static_cast<size_t>(s_kv), 0.0);
  for (int64_t s = (*c.ks)[t]; s < (*c.ke)[t]; ++s) {
    I[size_t(s)] = score_at(c, t, s, nullptr);
    out.scores.at(t, s) = float(I[size_t(s)]);
  }
  const std::vector<int64_t>& R = c.rows[size_t(t)];
  if (R.empty()) return;
  // 2. The target p and the student's log-softmax over R.
  std::vector<std::vector<double>> p_each;
  const std::vector<double> p = target_row(c, t, R, p_each);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t s : R) m = std::max(m, I[size_t(s)]);
  std::vector<double> e(R.size());
  double l = 0.0;
  for (size_t i = 0; i < R.size(); ++i) l += (e[i] = exp_portable(I[size_t(R[i])] - m));
  const double lse = m + std::log(l);
  // 3. kl[t] and dI = g (q * sum p - p).
  kl_and_d_scores(c, t, I.data(), 0, p, e, l, lse, out);
  apply_kl_form(c, t, p_each, p, out);
  // 4. dw'[t,h] and dq[t,h,:] through the head scores S[h, s], s ascending over R.
  std::vector<double> S(static_cast<size_t>(H) * R.size()), col(static_cast<size_t>(H));
  for (size_t i = 0; i < R.size(); ++i) {
    score_at(c, t, R[i], &col);
    for (int64_t h = 0; h < H; ++h) S[size_t(h) * R.size() + i] = col[size_t(h)];
  }
  std::vector<double> dq(static_cast<size_t>(D));
  for (int64_t h = 0; h < H; ++h) {
    const double wh = c.w[size_t(t * H + h)];
    double dw = 0.0;
    std::fill(dq.begin(), dq.end(), 0.0);
    for (size_t i = 0; i < R.size(); ++i) {
      const double Sv = S[size_t(h) * R.size() + i], dI = c.dI[size_t(t * s_kv + R[i])];
      dw += dI * (c.o.relu ? (Sv > 0.0 ? Sv : 0.0) : Sv);
      const double dS = (!c.o.relu || Sv > 0.0) ? dI * wh : 0.0;
      for (int64_t d = 0; d < D; ++d) dq[size_t(d)] += dS * c.k[size_t(R[i] * D + d)];
    }
    out.dw.at(t, h) = float(dw);
    for (int64_t d = 0; d < D; ++d) out.dq.at(t, h, d) = float(dq[size_t(d)]);
  }
}

void dk_keys(const LossContext& c, int64_t s_begin, int64_t s_end, IndexerLossOut& out) {
  const int64_t H = c.H, D = c.D;
  std::vector<double> acc(static_cast<size_t>((s_end - s_begin) * D), 0.0), col(static_cast<size_t>(H));
  for (int64_t t = 0; t < c.s_q; ++t) {
    const std::vector<int64_t>& R = c.rows[size_t(t)];
    for (auto it = std::lower_bound(R.begin(), R.end(), s_begin); it != R.end() && *it < s_end; ++it) {
      const int64_t s = *it;
      const double dI = c.dI[size_t(t * c.s_kv + s)];
      score_at(c, t, s, &col);
      double* a = &acc[size_t((s - s_begin) * D)];
      for (int64_t h = 0; h < H; ++h) {
        if (c.o.relu && !(col[size_t(h)] > 0.0)) continue;  // 1[S > 0]: dS = 0 adds nothing
        const double dS = dI * c.w[size_t(t * H + h)];
        const double* qh = &c.q[size_t((t * H + h) * D)];
        for (int64_t d = 0; d < D; ++d) a[d] += dS * qh[d];
      }
    }
  }
  for (int64_t s = s_begin; s < s_end; ++s)
    for (int64_t d = 0; d < D; ++d) out.dk.at(s, d) = float(acc[size_t((s - s_begin) * D + d)]);
}

void finish(const LossContext& c, IndexerLossOut& out) {
  double sum = 0.0;
  for (int64_t t = 0; t < c.s_q; ++t) sum += c.kl[size_t(t)];
  out.loss = c.o.per_token ? sum * c.o.loss_coeff : (sum / double(out.n_rows)) * c.o.loss_coeff;
}

}  // namespace detail

IndexerLossOut indexer_loss(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                            const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<int32_t>* topk,
                            const std::vector<TeacherLayer>& teachers, const IndexerLossOptions& o) {
  IndexerLossOut out;
  detail::LossContext c = detail::prepare(q, k, w, ks, ke, topk, teachers, o, out);
  for (int64_t t = 0; t < c.s_q; ++t) detail::loss_row(c, t, out);
  detail::dk_keys(c, 0, c.s_kv, out);
  detail::finish(c, out);
  return out;
}

IndexerLossOut indexer_loss_bf16(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<float>& w,
                                 const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const Tensor<int32_t>* topk,
                                 const std::vector<TeacherLayer>& teachers, const IndexerLossOptions& o) {
  Tensor<float> qf(q.shape), kf(k.shape);
  for (int64_t i = 0; i < q.numel(); ++i) qf[i] = bf16_to_f32(q[i]);
  for (int64_t i = 0; i < k.numel(); ++i) kf[i] = bf16_to_f32(k[i]);
  return indexer_loss(qf, kf, w, ks, ke, topk, teachers, o);
}

}  // namespace indexshare::ref::train
