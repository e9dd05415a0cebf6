// Option rules shared by the front ends (tools/lib/options.h).
#include "tools/lib/options.h"

#include <algorithm>
#include <cctype>
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

}  // namespace indexshare
