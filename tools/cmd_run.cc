// indexshare run: compute a DSA layer stack for a problem descriptor and print a summary.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "ref/error.h"
#include "ref/layer.h"
#include "ref/problem.h"
#include "tools/cli.h"

namespace indexshare::cli {

namespace {

// The problem `indexshare run` computes when none is given: DeepSeek-V3.2 kernel shapes for
// attention (d_qk 576, d_v 512) and the indexer (D 128), with fewer heads and a short sequence so
// that the readable reference path finishes in seconds; the sequence is longer than top-k, so
// the selection is really sparse.
constexpr const char* kDefaultProblem = "sq256 skv1024 hq16 dqk576 dv512 ih32 id128 k128 seed1";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename T>
uint64_t fingerprint(const std::vector<T>& v) {  // FNV-1a over the bytes: a summary, not a hash
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

int cmd_run(const std::string& desc, const std::string& impl) {
  require(impl == "ref", "--impl: only 'ref' is available in this build, got '" + impl + "'");
  const Problem p = parse_problem(desc);
  std::printf("problem   %s\n", to_string(p).c_str());
  auto t0 = std::chrono::steady_clock::now();
  const ref::LayerInputs in = ref::make_layer_inputs(p);
  const double t_gen = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const ref::LayerOutputs out = ref::run_layer(p, in);
  const double t_run = seconds_since(t0);

  // Indexer logits: how many are inside the causal windows, and their range.
  int64_t finite = 0;
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (float v : out.logits.data)
    if (std::isfinite(v)) { ++finite; lo = std::min(lo, v); hi = std::max(hi, v); }
  // Top-k: selected counts and rows shorter than k (dense rows).
  int64_t selected = 0, short_rows = 0;
  for (int64_t t = 0; t < p.s_q; ++t) {
    const int64_t len = in.ke[t] - in.ks[t];
    selected += std::min(len, p.index_topk);
    short_rows += len <= p.index_topk;
  }
  float omax = 0, lse_lo = std::numeric_limits<float>::infinity(), lse_hi = -lse_lo;
  for (float v : out.attn.out.data) omax = std::max(omax, std::fabs(v));
  for (float v : out.attn.lse.data) { lse_lo = std::min(lse_lo, v); lse_hi = std::max(lse_hi, v); }

  std::printf("indexer   %s logits: %lld of %lld inside the causal windows, range [%.6g, %.6g]\n",
              indexer_mode_name(p.indexer).c_str(), (long long)finite, (long long)out.logits.numel(), lo, hi);
  std::printf("top-k     k=%lld: %.1f positions per row on average; %lld of %lld rows are shorter than k (dense)\n",
              (long long)p.index_topk, double(selected) / double(p.s_q), (long long)short_rows, (long long)p.s_q);
  std::printf("attention out [%lld,%lld,%lld] max |out| %.6g; lse (natural log, no sink) in [%.6g, %.6g]\n",
              (long long)p.s_q, (long long)p.h_q, (long long)p.d_v, omax, lse_lo, lse_hi);
  std::printf("fingerprints (FNV-1a of bytes) logits %016llx topk %016llx out %016llx lse %016llx\n",
              (unsigned long long)fingerprint(out.logits.data), (unsigned long long)fingerprint(out.topk.data),
              (unsigned long long)fingerprint(out.attn.out.data), (unsigned long long)fingerprint(out.attn.lse.data));
  std::printf("time      inputs %.3f s, layer %.3f s (impl %s)\n", t_gen, t_run, impl.c_str());
  std::printf("__REPRO: indexshare run --impl %s --problem \"%s\"\n", impl.c_str(), to_string(p).c_str());
  return 0;
}

}  // namespace

Action register_run(CLI::App& app) {
  auto desc = std::make_shared<std::string>(kDefaultProblem);
  auto impl = std::make_shared<std::string>("ref");
  CLI::App* run = app.add_subcommand("run", "Compute one DSA layer (indexer, top-k, sparse attention) and print a summary");
  run->add_option("--problem,-p", *desc, "Problem descriptor, e.g. \"sq256 skv1024 k128 seed7\"")->capture_default_str();
  run->add_option("--impl", *impl, "Implementation: ref")->capture_default_str();
  return [run, desc, impl]() { return *run ? cmd_run(*desc, *impl) : -1; };
}

}  // namespace indexshare::cli
