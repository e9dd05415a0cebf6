// Helpers shared by the subcommands (tools/cli.h).
#include <cctype>
#include <cstdint>
#include <cstdio>

#include "ref/error.h"
#include "simd/simd.h"
#include "tools/cli.h"

namespace indexshare::cli {

std::string resolve_impl(const std::string& impl, const Problem& p) {
  if (impl == "ref" || impl == "simd") return impl;
  require(impl == "auto", "--impl: expected ref, simd or auto, got '" + impl + "'");
  const double macs = double(p.s_q) * double(p.seq_kv()) * double(p.index_n_heads) * double(p.index_head_dim) * double(p.n_layers);
  return macs > double(1 << 28) ? "simd" : "ref";
}

void apply_target(const std::string& target) {
  if (!target.empty()) simd::set_target(target);
}

uint64_t estimate_stack_bytes(const Problem& p, bool keep_logits) {
  const double H = double(p.index_n_heads), D = double(p.index_head_dim), sq = double(p.s_q), skv = double(p.s_kv);
  const double per_layer = sq * H * D * 5 + skv * D * 5 + sq * H * 8 + sq * 8  // indexer q, k, scales, weights, bounds
                           + (keep_logits ? sq * skv * 4 : 0.0)                  // logits
                           + sq * double(p.index_topk) * 12                       // top-k, used, indices
                           + sq * double(p.h_q) * double(p.d_qk) * 2 + skv * double(p.d_qk) * 2  // attn q, kv
                           + sq * double(p.h_q) * (double(p.d_v) * 6 + 8);        // out, out_bf16, lse, max
  const double total = per_layer * double(p.n_layers);
  return total >= 1.8e19 ? UINT64_MAX : uint64_t(total);  // saturate instead of overflowing
}

void check_memory(const Problem& p, bool keep_logits, uint64_t max_bytes) {
  const uint64_t need = estimate_stack_bytes(p, keep_logits);
  if (need > max_bytes) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "the problem needs about %.3g GB (%s logits), above --max-memory %.3g GB: "
                  "use --no-logits / fewer rows or layers, or raise --max-memory",
                  double(need) / 1e9, keep_logits ? "with" : "without", double(max_bytes) / 1e9);
    throw Error(buf);
  }
}

uint64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  const std::string digits = text.substr(0, i), unit = text.substr(i);
  if (digits.empty() || digits.size() > 15) throw Error("--max-memory: cannot read '" + text + "' (e.g. 8G, 512M, 1000000)");
  const uint64_t v = std::stoull(digits);
  int shift = -1;
  if (unit == "" || unit == "B") shift = 0;
  if (unit == "K" || unit == "KB") shift = 10;
  if (unit == "M" || unit == "MB") shift = 20;
  if (unit == "G" || unit == "GB") shift = 30;
  if (unit == "T" || unit == "TB") shift = 40;
  if (shift < 0) throw Error("--max-memory: unknown unit in '" + text + "' (expected K, M, G or T)");
  if (v > (UINT64_MAX >> shift)) throw Error("--max-memory: '" + text + "' does not fit in 64 bits");
  return v << shift;
}

}  // namespace indexshare::cli
