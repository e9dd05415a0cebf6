// Helpers shared by the subcommands (tools/cli/cli.h).
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "ref/error.h"
#include "simd/simd.h"
#include "tools/cli/cli.h"

namespace indexshare::cli {

void apply_target(const std::string& target) {
  if (!target.empty()) simd::set_target(target);
}

uint64_t estimate_model_bytes(const ModelConfig& c, bool golden) {
  const double S = double(c.seq), dim = double(c.dim), H = double(c.index_n_heads), D = double(c.index_head_dim);
  const double nh = double(c.n_heads), ql = double(c.q_lora_rank), kl = double(c.kv_lora_rank);
  const double rope = double(c.qk_rope_head_dim), nope = double(c.qk_nope_head_dim), v = double(c.v_head_dim);
  const double weights = 4 * (H * D * ql + D * dim + 2 * D + H * dim                              // indexer
                              + ql * dim + ql + nh * (nope + rope) * ql + (kl + rope) * dim + kl  // MLA down, norms
                              + nh * (nope + v) * kl + dim * nh * v + dim);                       // up, wo, attn norm
  const double trace = S * dim * 4 * 2 + S * ql * 4                         // x, out, qr
                       + S * H * D * (4 * 4 + 1) + S * D * (5 * 4 + 1)      // indexer q/k stages, FP8 codes
                       + S * H * 8 + S * 4                                  // scales, head weights
                       + S * S * 4                                          // logits [seq, seq]
                       + S * double(c.index_topk) * 8                       // own and used top-k
                       + S * nh * double(c.d_qk()) * (2 + 4)                // q (bf16), MLA's f32 intermediates
                       + S * nh * (double(c.d_v()) * 6 + 8);                // attention outputs
  const double cache = S * double(c.d_qk()) * 2 + S * D * 5 + S * 4;       // latent kv, indexer keys
  // Transient, once: simd::linear packs its input rows as doubles (the widest input is wo's
  // n_heads * v, or dim) and simd::head_linear packs one head's rows per thread.
  const double packed = S * std::max({dim, ql, nh * v, kl}) * 8 + S * kl * 8 * double(omp_get_max_threads());
  const double total =
      (weights + trace + cache) * double(c.n_layers) * (golden ? 2 : 1) + S * dim * 4 * 2 + packed;
  return total >= 1.8e19 ? UINT64_MAX : uint64_t(total);  // saturate instead of overflowing
}

void check_model_memory(const ModelConfig& c, uint64_t max_bytes, bool golden) {
  const uint64_t need = estimate_model_bytes(c, golden);
  if (need > max_bytes) {
    char buf[320];
    std::snprintf(buf, sizeof buf, "the %s toy model needs about %.3g GB (%d layers, seq %lld%s), above --max-memory %.3g GB: "
                  "use a smaller --seq or --layers, or raise --max-memory",
                  c.name.c_str(), double(need) / 1e9, c.n_layers, (long long)c.seq, golden ? ", golden set" : "",
                  double(max_bytes) / 1e9);
    throw Error(buf);
  }
}

namespace {
struct Renamed {
  std::string command, new_name, old_name;
};
std::vector<Renamed>& renames() {
  static std::vector<Renamed> r;
  return r;
}
}  // namespace

std::string renamed(const std::string& command, const std::string& new_name, const std::string& old_name) {
  renames().push_back({command, new_name, old_name});
  return new_name + "," + old_name;
}

std::string old_name_notices(int argc, const char* const* argv) {
  std::string out;
  if (argc < 2) return out;
  for (const Renamed& r : renames()) {
    if (r.command != argv[1]) continue;
    for (int i = 2; i < argc; ++i) {
      const std::string tok = argv[i];
      if (tok == r.old_name || tok.rfind(r.old_name + "=", 0) == 0) {
        out += "indexshare: " + r.old_name + " is now " + r.new_name + "; the old name works for this release\n";
        break;
      }
    }
  }
  return out;
}

std::vector<std::string> given_options(const CLI::App& c) {
  std::vector<std::string> given;
  for (const CLI::Option* o : c.get_options())
    if (o->count() > 0) given.push_back(o->get_name());
  return given;
}

bool was_given(const std::vector<std::string>& given, const std::string& name) {
  return std::find(given.begin(), given.end(), name) != given.end();
}

void reject_given(const std::vector<std::string>& given, std::initializer_list<const char*> names,
                  const std::string& applies_to, const std::string& why) {
  for (const char* n : names)
    require(!was_given(given, n), std::string(n) + " applies to " + applies_to + " only (" + why + ")");
}

void excludes(CLI::App& c, const std::string& opt, std::initializer_list<const char*> others) {
  CLI::Option* o = c.get_option(opt);
  for (const char* n : others) o->excludes(c.get_option(n));
}

void needs(CLI::App& c, const std::string& opt, const std::string& other) { c.get_option(opt)->needs(c.get_option(other)); }

void reject_target_on_ref(const std::vector<std::string>& given, Impl impl) {
  if (impl == Impl::ref) reject_given(given, {"--target"}, "the simd path", "this computation runs on ref; add --impl simd");
}

void check_overrides(const std::vector<std::string>& given, int64_t layers, int64_t seq, int64_t seed) {
  if (was_given(given, "--seed")) require(seed >= 0, "--seed must be >= 0, got " + std::to_string(seed));
  if (was_given(given, "--layers")) check_range(option_spec("golden", "--layers"), layers);
  if (was_given(given, "--seq")) check_range(option_spec("golden", "--seq"), seq);
}

void strict_values(CLI::App& app) {
  const CLI::Validator fits_int64(
      [](std::string& s) -> std::string {
        int64_t v = 0;
        const char* b = s.data() + (!s.empty() && s[0] == '+');
        const auto [end, ec] = std::from_chars(b, s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range) return "'" + s + "' is out of range (a 64-bit integer)";
        if (ec != std::errc() || end != s.data() + s.size()) return "'" + s + "' is not an integer";
        return std::string();
      },
      "INT64", "int64");
  const CLI::Validator non_empty([](std::string& s) { return s.empty() ? std::string("an empty value") : std::string(); },
                                 "", "non-empty");
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    for (CLI::Option* o : sub->get_options()) {
      if (o->get_type_name() == "INT") o->check(fits_int64);
      if (o->get_type_name() == "TEXT") o->check(non_empty);
    }
}

bool impl_streams(Impl impl, const Problem& p) {
  return ref::layer_topk_streams(p, kernels_for(impl));
}

uint64_t estimate_stack_bytes(const Problem& p, bool keep_logits, bool streams, int64_t n_rows, bool golden) {
  const double H = double(p.index_n_heads), D = double(p.index_head_dim), skv = double(p.s_kv);
  const double sq = double(n_rows > 0 ? n_rows : p.s_q);  // query rows actually computed
  // Key-side inputs are generated in blocks of 4096 keys (ref/layer.cc): a bounded f32 scratch.
  const double scratch = 4096.0 * (3 * D + 2 * double(p.d_qk)) * 4;
  const double index_k = p.indexer == IndexerMode::fp8 ? skv * (D + 4) : skv * (D * 4 + 4);  // k, k_scale
  const double per_layer = sq * H * D * 5 + index_k + sq * H * 8 + sq * 8     // indexer q, k, scales, weights, bounds
                           + (keep_logits ? sq * skv * 4 : 0.0)                  // logits
                           + sq * double(p.index_topk) * 12                       // top-k, used, indices
                           + sq * double(p.h_q) * double(p.d_qk) * 2 + skv * double(p.d_qk) * 2  // attn q, kv
                           + sq * double(p.h_q) * (double(p.d_v) * 6 + 8);        // out, out_bf16, lse, max
  // A golden set copies every tensor once more into its safetensors views before writing.
  // Logits computed but not kept: one layer's at a time, freed after its top-k.
  const double transient = keep_logits || streams ? 0.0 : sq * skv * 4;
  const double total = per_layer * double(p.n_layers) * (golden ? 2 : 1) + transient + scratch;
  return total >= 1.8e19 ? UINT64_MAX : uint64_t(total);  // saturate instead of overflowing
}

std::string logits_remedy(const Problem& p, bool keep_logits, bool streams, uint64_t max_bytes, int64_t n_rows,
                          bool golden, bool offers_no_logits) {
  const bool simd_helps = !streams && p.indexer == IndexerMode::fp8 &&
                          estimate_stack_bytes(p, false, true, n_rows, golden) <= max_bytes;
  if (keep_logits && offers_no_logits)
    return std::string("--no-logits") + (simd_helps ? " with --impl simd (the indexer then streams)" : "") + ", ";
  return !keep_logits && simd_helps ? "--impl simd (streams the indexer), " : "";
}

void check_memory(const Problem& p, bool keep_logits, bool streams, uint64_t max_bytes, const std::string& remedies,
                  int64_t n_rows, bool golden) {
  const uint64_t need = estimate_stack_bytes(p, keep_logits, streams, n_rows, golden);
  if (need > max_bytes) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "the problem needs about %.3g GB (%lld query rows, %s%s), above --max-memory %.3g GB: ",
                  double(need) / 1e9, (long long)(n_rows > 0 ? n_rows : p.s_q),
                  keep_logits ? "logits kept" : streams ? "logits streamed" : "one layer's logits at a time",
                  golden ? ", golden set" : "", double(max_bytes) / 1e9);
    throw Error(buf + remedies + ", or raise --max-memory");
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
