// indexshare bench: the sparse attention backward stage (cmd_bench.cc's header says what it times).
//
//   simd     simd::sparse_attention_backward of layer 0 (its q, kv, top-k indices and sink) with a
//            d_out drawn by the project's generator, without the per-slot p and ds (slots = false:
//            [s_q, h_q, top-k] each, 2 GiB at the FlashMLA prefill shape). FLOPs = 2 * h_q * (3 d_qk +
//            2 d_v) * V: the multiply-adds of the logits (d_qk), dP (d_v), dq (d_qk) and dkv (d_qk +
//            d_v) per valid index and head, 2.53x the forward's at d_qk 576, d_v 512.
//   ref      ref::sparse_attention_backward on the last R query rows (the longest lists under a
//            causal window), R the most rows whose FLOPs stay within kRefBackwardFlops (all rows on
//            small problems); each time is scaled by V / V_R (valid indices of all rows over those of
//            the R rows) to the whole problem, and the note says so. simd's backward on the same R
//            rows must give ref's bits.
//   forward  the simd forward timed again here, alternating with the backward (a forward, then a
//            backward, per repeat; the repeat rules on the pairs, with 2x --seconds): the ratio is
//            the median of the pairs' ratios, so that a busy neighbour's drift falls on both alike.
//   memory   peak RSS growth of one untimed call each (forward; backward without slots): the peak
//            is reset through /proc/self/clear_refs, then VmHWM after the call minus VmRSS before
//            (outputs and working buffers as the kernel touches them; malloc_trim first, so that
//            pages freed by earlier calls are not reused unseen; n/a where Linux refuses).
// Goals: backward / forward time <= 3, simd over ref (scaled) >= 20, backward's RSS growth <= 2x the
// forward's.
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "ref/rng.h"
#include "ref/train/attention_bwd.h"
#include "tools/cli/bench.h"

namespace indexshare::cli::bench {

namespace {

constexpr double kRefBackwardFlops = 8e9;  // ~5 s of ref's backward (~1.7 GFLOP/s on one Zen 4 core)

// A field of /proc/self/status in KiB, -1 when missing.
int64_t status_kib(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  return -1;
}

// Peak RSS growth of fn, in bytes (-1 when the peak cannot be reset or read).
double rss_growth(const std::function<void()>& fn) {
  {
    std::ofstream cr("/proc/self/clear_refs");
    if (!cr) return -1;
    cr << "5";
    cr.flush();
    if (!cr) return -1;
  }
  malloc_trim(0);  // freed heap pages back to the system, so that the call's own pages count
  const int64_t before = status_kib("VmRSS:");
  fn();
  const int64_t peak = status_kib("VmHWM:");
  return before < 0 || peak < 0 ? -1 : double(peak - before) * 1024.0;
}

// The last r rows (dimension 0) of x.
template <typename T>
Tensor<T> last_rows(const Tensor<T>& x, int64_t r) {
  std::vector<int64_t> shape = x.shape;
  const int64_t per = x.numel() / shape[0], skip = shape[0] - r;
  shape[0] = r;
  Tensor<T> y(shape);
  std::copy(x.ptr() + skip * per, x.ptr() + (skip + r) * per, y.ptr());
  return y;
}

bool same_bwd(const ref::AttentionBackwardOut& a, const ref::AttentionBackwardOut& b) {
  return same_floats(a.lse, b.lse) && same_floats(a.delta, b.delta) && same_floats(a.dq, b.dq) &&
         same_floats(a.dkv, b.dkv) && same_floats(a.d_sink, b.d_sink) && a.dq_bf16.data == b.dq_bf16.data &&
         a.dkv_bf16.data == b.dkv_bf16.data;
}

std::string mib(double bytes) { return bytes < 0 ? "n/a" : fmt("%.0f MiB", bytes / 1048576.0); }

}  // namespace

// Step: the backward stage (simd; ref on a subset of rows, scaled), its memory and agreement.
void Bench::time_attention_backward() {
  const int64_t s_q = p.s_q, h_q = p.h_q, topk = indices.dim(2);
  Tensor<bf16_t> d_out({s_q, h_q, p.d_v});
  fill_range_bf16(d_out.ptr(), 0, d_out.numel(), Dist::normal, 1.0f, p.seed, stream_tag("bench.attn.d_out"));
  const double per_index = 2.0 * double(h_q) * double(3 * p.d_qk + 2 * p.d_v);
  const double f_bwd = per_index * double(valid);
  double ref_scaled = 0;
  if (do_ref) {
    int64_t r = 0, v_r = 0;
    for (; r < s_q; ++r) {
      const int64_t t = s_q - 1 - r;
      int64_t v = 0;
      for (int64_t j = 0; j < topk; ++j) v += indices[t * topk + j] >= 0 && indices[t * topk + j] < p.s_kv;
      if (r > 0 && per_index * double(v_r + v) > kRefBackwardFlops) break;
      v_r += v;
    }
    const Tensor<bf16_t> q_r = last_rows(in.q, r), do_r = last_rows(d_out, r);
    const Tensor<int32_t> ind_r = last_rows(indices, r);
    const double scale = v_r > 0 ? double(valid) / double(v_r) : 1.0;
    ref::AttentionBackwardOut want;
    progress("attention backward (ref, last " + std::to_string(r) + " rows)");
    StageResult row{"attention backward", impl_name(Impl::ref), 1, {}, f_bwd, 0, 0, 0,
                    r == s_q ? "" : "last " + std::to_string(r) + " of " + std::to_string(s_q) + " rows, times x" +
                                        fmt("%.4g", scale) + " (valid indices)"};
    for (double t : time_runs([&] { want = ref::sparse_attention_backward(q_r, in.kv, ind_r,
                                                                          p.sm_scale(), p.d_v, do_r, nullptr, sink,
                                                                          false); },
                              a.repeats, a.budget))
      row.samples.push_back(t * scale);
    rows.push_back(row);
    ref_scaled = row.med();
    const ref::AttentionBackwardOut got =
        simd::sparse_attention_backward(q_r, in.kv, ind_r, p.sm_scale(), p.d_v, do_r, nullptr, sink, false);
    if (!same_bwd(want, got)) mismatches.push_back("attention backward");
    bwd.ref_rows = r;
  }
  // simd: the forward and the backward alternately (a pair per repeat, the repeat rules applied to
  // the pairs), so that the machine's drift falls on both alike; the ratio is the median of the
  // pairs' ratios.
  progress("attention forward and backward, alternating (simd)");
  const auto fwd = [&] { simd::sparse_attention(in.q, in.kv, indices, p.sm_scale(), p.d_v, nullptr, sink); };
  const auto back = [&] {
    simd::sparse_attention_backward(in.q, in.kv, indices, p.sm_scale(), p.d_v, d_out, nullptr, sink, false);
  };
  StageResult rf{"attention fwd (pairs)", impl_name(Impl::simd), threads, {}, f_attn, 0, 0, 0, "alternating with the backward"};
  StageResult rb{"attention backward", impl_name(Impl::simd), threads, {}, f_bwd, 0, 0, 0, "p and ds not kept"};
  std::vector<double> ratios;
  double total = 0;
  for (bool first = true; first || (int(rb.samples.size()) < a.repeats && total <= 2 * a.budget);) {
    const double t0 = now_s();
    fwd();
    const double t1 = now_s();
    back();
    const double t2 = now_s();
    const bool warmup = first && t2 - t0 < 1.0;  // a short first pair is a warm-up (0.5 s each)
    first = false;
    if (warmup) continue;
    rf.samples.push_back(t1 - t0);
    rb.samples.push_back(t2 - t1);
    ratios.push_back((t2 - t1) / (t1 - t0));
    total += t2 - t0;
  }
  if (ref_scaled > 0) rb.speedup = ref_scaled / rb.med();
  rows.push_back(rf);
  rows.push_back(rb);
  bwd.fwd_s = rf.med();
  bwd.bwd_s = rb.med();
  bwd.ratio = median(ratios);
  bwd.speedup = rb.speedup;
  progress("attention forward and backward memory (simd, one call each)");
  bwd.fwd_bytes = rss_growth([&] { simd::sparse_attention(in.q, in.kv, indices, p.sm_scale(), p.d_v, nullptr, sink); });
  bwd.bwd_bytes = rss_growth(
      [&] { simd::sparse_attention_backward(in.q, in.kv, indices, p.sm_scale(), p.d_v, d_out, nullptr, sink, false); });
  bwd.on = true;
}

// Step: the backward's line and JSON.
void Bench::report_attention_backward() {
  if (!bwd.on) return;
  const double ratio = bwd.ratio;
  const double mem = bwd.fwd_bytes > 0 && bwd.bwd_bytes >= 0 ? bwd.bwd_bytes / bwd.fwd_bytes : -1;
  std::printf("\nbackward  simd attention backward %.3f s, forward %.3f s (medians of alternating runs): backward / forward "
              "%.2fx (median of the pairs' ratios; multiply-adds %.2fx); peak RSS "
              "growth of one call: forward %s, backward %s (%s)\n",
              bwd.bwd_s, bwd.fwd_s, ratio, double(3 * p.d_qk + 2 * p.d_v) / double(p.d_qk + p.d_v),
              mib(bwd.fwd_bytes).c_str(), mib(bwd.bwd_bytes).c_str(), mem < 0 ? "n/a" : fmt("%.2fx", mem).c_str());
  j["attention_backward"] = {{"simd_s", bwd.bwd_s},           {"forward_simd_s", bwd.fwd_s},
                             {"backward_over_forward", ratio}, {"speedup_over_ref", bwd.speedup},
                             {"ref_rows", bwd.ref_rows},       {"forward_rss_growth_bytes", bwd.fwd_bytes},
                             {"backward_rss_growth_bytes", bwd.bwd_bytes},
                             {"memory_ratio", mem < 0 ? json(nullptr) : json(mem)}};
}

}  // namespace indexshare::cli::bench
