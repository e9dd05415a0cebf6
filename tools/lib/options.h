// indexshare: option rules shared by the front ends (the CLI's tools/cli and the Python package's
// tools/python): which implementation `impl="auto"` takes, and the query-row list of a sampled
// golden set (--rows / rows=).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ref/config.h"
#include "ref/problem.h"
#include "tools/lib/impl.h"

namespace indexshare {

// --impl: "ref", "simd", or "auto" (simd when the indexer work of the problem exceeds about
// 2^28 multiply-accumulates, where ref takes a second or more; n_rows > 0: that many query rows,
// --rows). The one place the text becomes an Impl (tools/lib/impl.h).
Impl resolve_impl(const std::string& impl, const Problem& p, int64_t n_rows = 0);
// The rule under both: "ref" or "simd" as given, "auto" -> simd when `large`; Error otherwise.
Impl choose_impl(const std::string& impl, bool large);
// --impl for the module-level toy model (run/golden --model): "auto" takes simd when the layers'
// projections exceed about 2^28 multiply-accumulates (layers, seq: 0 = the config's).
Impl resolve_model_impl(const std::string& impl, const ModelConfig& cfg, int64_t layers, int64_t seq);
// --rows: a comma-separated list of items, each
//   N          row N                      A-B        rows A..B (inclusive, A <= B)
//   last:N     the last N rows            every:N    rows 0, N, 2N, ... (< s_q)
// in the order written. Every row must be in [0, s_q) and appear once; Error naming --rows and the
// item otherwise (an empty list too). ref::format_rows prints the canonical text:
// parse_rows(ref::format_rows(r), p) == r.
std::vector<int64_t> parse_rows(const std::string& text, const Problem& p);

// The one vocabulary of the options `golden`, `diff`, `overlap` and `cost` share with the Python
// package (indexshare.golden / diff / overlap / cost; indexshare.options() lists this table): per option its
// CLI name, its Python keyword ("train.loss": a key of golden's train= dict), what it means (the
// CLI's --help text) and, for the integer overrides, the range both front ends enforce.
struct OptionSpec {
  std::string command, cli, python, meaning;
  int64_t lo = 0, hi = 0;  // lo < hi: the accepted range (inclusive)
  std::string range;       // the range's upper bound as the messages print it ("10^6")
  OptionSpec(std::string cmd, std::string c, std::string py, std::string m, int64_t l = 0, int64_t h = 0, std::string r = "")
      : command(std::move(cmd)), cli(std::move(c)), python(std::move(py)), meaning(std::move(m)), lo(l), hi(h), range(std::move(r)) {}
};
const std::vector<OptionSpec>& option_table();
// The row of `cli` in `command`; Error naming both when there is none.
const OptionSpec& option_spec(const std::string& command, const std::string& cli);
// Error "--layers must be in [1, 10^6], got 0" (the CLI's name) unless lo <= v <= hi.
void check_range(const OptionSpec& o, int64_t v);
}  // namespace indexshare
