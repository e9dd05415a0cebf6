// Option rules shared by the front ends (tools/lib/options.h).
#include "tools/lib/options.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ref/error.h"

namespace indexshare {

Impl choose_impl(const std::string& impl, bool large) {
  if (const std::optional<Impl> named = impl_named(impl)) return *named;
  require(impl == "auto", "--impl: expected ref, simd or auto, got '" + impl + "'");
  return large ? Impl::simd : Impl::ref;
}

Impl resolve_impl(const std::string& impl, const Problem& p, int64_t n_rows) {
  if (impl != "auto") return choose_impl(impl, false);
  const double macs = double(n_rows > 0 ? n_rows : p.s_q) * double(p.seq_kv()) * double(p.index_n_heads) * double(p.index_head_dim) * double(p.n_layers);
  return choose_impl(impl, macs > double(1 << 28));
}

Impl resolve_model_impl(const std::string& impl, const ModelConfig& cfg, int64_t layers, int64_t seq) {
  if (impl != "auto") return choose_impl(impl, false);
  const double L = double(layers > 0 ? layers : cfg.n_layers), S = double(seq > 0 ? seq : cfg.seq);
  const double per_row = double(cfg.dim) * double(cfg.q_lora_rank + cfg.kv_lora_rank) +
                         double(cfg.q_lora_rank) * double(cfg.index_n_heads * cfg.index_head_dim);
  return choose_impl(impl, L * S * per_row > double(1 << 28));
}

namespace {
// A non-negative decimal integer of at most 18 digits (no sign, no spaces), else nullopt.
std::optional<int64_t> read_count(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  return std::stoll(s);
}
}  // namespace

std::vector<int64_t> parse_rows(const std::string& text, const Problem& p) {
  const int64_t s_q = p.s_q;
  std::vector<int64_t> rows;
  std::vector<bool> seen(static_cast<size_t>(s_q), false);
  auto bad = [&](const std::string& item, const std::string& why) {
    throw Error("--rows: item '" + item + "' in '" + text + "': " + why);
  };
  auto push = [&](const std::string& item, int64_t t) {
    if (t < 0 || t >= s_q) bad(item, "row " + std::to_string(t) + " is outside [0, sq = " + std::to_string(s_q) + ")");
    if (seen[size_t(t)]) bad(item, "row " + std::to_string(t) + " is already listed");
    seen[size_t(t)] = true;
    rows.push_back(t);
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const std::string usage = "expected N, A-B, last:N or every:N";
    if (item.empty()) bad(item, "empty item (" + usage + ")");
    const size_t colon = item.find(':'), dash = item.find('-');
    if (colon != std::string::npos) {
      const std::string key = item.substr(0, colon);
      const std::optional<int64_t> n = read_count(item.substr(colon + 1));
      if (!n || *n < 1) bad(item, "the count must be an integer >= 1 (" + usage + ")");
      if (key == "last") {
        if (*n > s_q) bad(item, "sq is " + std::to_string(s_q) + ", fewer than " + std::to_string(*n) + " rows");
        for (int64_t t = s_q - *n; t < s_q; ++t) push(item, t);
      } else if (key == "every") {
        for (int64_t t = 0; t < s_q; t += *n) push(item, t);
      } else {
        bad(item, "unknown selector '" + key + "' (" + usage + ")");
      }
    } else if (dash != std::string::npos) {
      const std::optional<int64_t> a = read_count(item.substr(0, dash)), b = read_count(item.substr(dash + 1));
      if (!a || !b) bad(item, "not a range of two row numbers (" + usage + ")");
      if (*b < *a) bad(item, "the range ends before it starts");
      if (*b >= s_q) bad(item, "row " + std::to_string(*b) + " is outside [0, sq = " + std::to_string(s_q) + ")");
      for (int64_t t = *a; t <= *b; ++t) push(item, t);
    } else {
      const std::optional<int64_t> t = read_count(item);
      if (!t) bad(item, "not a row number (" + usage + ")");
      push(item, *t);
    }
  }
  return rows;
}

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> t = {
      {"golden", "--preset", "preset", "Golden preset (see `indexshare presets`; a kernel preset is written --for its kernel)"},
      {"golden", "--problem", "problem", "Problem descriptor"},
      {"golden", "--kind", "kind",
       "stack, attention-edge, decode, train, v4, mtp, hyv4 or kpool (with --problem; v4: a V4 descriptor, tools/lib/golden_v4.h; "
       "mtp: a problem with steps= accept=, tools/lib/golden_mtp.h; hyv4: a problem with rope= vd=, tools/lib/golden_hyv4.h; "
       "kpool: a kpool descriptor, tools/lib/golden_kpool.h)"},
      {"golden", "--model", "model", "Module-level set from the toy model with a preset's shapes (tiny-glm, tiny-deepseek, glm-5.2, ...)"},
      {"golden", "--from", "from_dump", "Kernel-level stack from per-layer inputs dumped from a real model (golden tensor names)"},
      {"golden", "--for", "for_kernel",
       "Check the problem against a GPU kernel's constraints and write its call in the manifest (see `indexshare kernels`)"},
      {"golden", "--rows", "rows", "Sampled set of these query rows, e.g. 0,17,100-131,last:64,every:1024 (kind stack)"},
      {"golden", "--impl", "impl", "Implementation: ref, simd or auto (the same bytes; auto takes simd for large problems)"},
      {"golden", "--no-logits", "logits", "Leave out the [s_q, s_kv] indexer logits (Python: logits=False)"},
      {"golden", "--layers", "layers", "Override the number of layers", 1, 1000000, "10^6"},
      {"golden", "--seq", "seq", "Override the sequence length (kernel sets: s_kv, s_q capped at it)", 1, INT32_MAX, "2^31 - 1"},
      {"golden", "--seed", "seed", "Override the seed", 0, INT64_MAX, "2^63 - 1"},
      {"golden", "--schedule", "schedule", "Layer schedule (--model)"},
      {"golden", "--sim", "sim", "Cross-layer weight similarity (--model)"},
      {"golden", "--variant", "variant", "Indexer variant deepseek_fp8 or hf_bf16 (--model)"},
      {"golden", "--loss", "train.loss", "Indexer loss support: sparse (top-k and valid keys) or dense (--kind train)"},
      {"golden", "--train-target", "train.target",
       "Teacher of a Full layer's indexer: own-layer (Megatron) or served-layers (IndexCache) (--kind train)"},
      {"golden", "--kl-form", "train.kl_form",
       "With --train-target served-layers, what kl and loss hold: kl-of-mean (KL(mean_j p_j || q)) or mean-of-kl "
       "(mean_j KL(p_j || q)); the gradients are the same (--kind train)"},
      {"golden", "--relu", "train.relu", "ReLU on the indexer's head scores: yes, or no (GLM-5) (--kind train)"},
      {"golden", "--loss-coeff", "train.loss_coeff", "The loss coefficient (--kind train)"},
      {"golden", "--loss-layers", "train.loss_layers",
       "Layers whose indexer is distilled, comma-separated (default: every Full layer; a Shared layer needs "
       "--train-target served-layers, and then stands for its source) (--kind train)"},
      {"golden", "--train-edges", "train.edges",
       "yes: the backward's edge cases in every layer (-1 rows, out-of-range and duplicated indices, topk_length, rows "
       "without keys) (--kind train)"},
      {"diff", "--golden", "golden", "Golden set folder"},
      {"diff", "--candidate", "candidate", "Candidate safetensors file with any subset of the golden's output names"},
      {"diff", "--layer-list", "layer_list", "Layers to judge, e.g. 0,3-5 (default: every layer the candidate holds)"},
      {"diff", "--precision", "precision",
       "The arithmetic the indexer's logits are held to by the precision test and the top-k's near ties: logits=CLASS with "
       "CLASS f32, fp8mma (the default: Hopper's FP8 tensor-core accumulation), f16 or bf16 (a kernel documented as low "
       "precision). The attention is held to f32 (attn=f32). kl=mean-of-kl or kl=kl-of-mean: the loss convention a "
       "served-layers indexer loss declares"},
      {"diff", "--impl", "impl", "Kernels of the recomputed expectations: ref, simd or auto (the same results)"},
      {"overlap", "--golden", "golden", "A golden set folder"},
      {"overlap", "--problem", "problem", "A generated kernel-level stack (problem descriptor)"},
      {"overlap", "--impl", "impl", "Kernels of the recomputations: ref, simd or auto (the same results)"},
      {"overlap", "--buckets", "buckets", "Query-position buckets"},
      {"overlap", "--no-shared-stats", "shared_stats", "Skip the dense-attention statistics of Shared layers (Python: shared_stats=False)"},
      {"cost", "--model", "model", "Model preset: deepseek-v3.2, glm-5, glm-5.2, tiny-deepseek, tiny-glm"},
      {"cost", "--context", "contexts", "Context lengths, comma-separated (4096, 16K, 1M)"},
      {"cost", "--schedule", "schedule",
       "Layer schedule (default: the config's own): all-full, glm-5.2, one-full-three-shared, hy-v4, an F/S pattern, "
       "freq:4,offset:3 or list:full,shared,..."},
      {"cost", "--mode", "mode", "decode, prefill or both"},
  };
  return t;
}

const OptionSpec& option_spec(const std::string& command, const std::string& cli) {
  for (const OptionSpec& o : option_table())
    if (o.command == command && o.cli == cli) return o;
  throw Error("option table: " + command + " has no option " + cli);
}

void check_range(const OptionSpec& o, int64_t v) {
  require(o.lo <= v && v <= o.hi,
          o.cli + " must be in [" + std::to_string(o.lo) + ", " + o.range + "], got " + std::to_string(v));
}

}  // namespace indexshare
