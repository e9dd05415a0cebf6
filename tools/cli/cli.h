// indexshare CLI: each subcommand lives in its own tools/cmd_*.cc and registers itself here.
//
// A subcommand's register function adds a CLI11 subcommand and returns the action to run when
// that subcommand was given. Actions return the exit status: 0 success, 1 a check failed,
// 2 bad input or usage. They throw indexshare::Error for bad input; main prints it and exits 2.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace indexshare::cli {

using Action = std::function<int()>;

Action register_run(CLI::App& app);
Action register_cost(CLI::App& app);
Action register_golden(CLI::App& app);
Action register_presets(CLI::App& app);
Action register_kernels(CLI::App& app);
Action register_verify(CLI::App& app);
Action register_diff(CLI::App& app);
Action register_overlap(CLI::App& app);
Action register_search(CLI::App& app);
Action register_bench(CLI::App& app);
Action register_calibrate(CLI::App& app);
Action register_explain(CLI::App& app);

}  // namespace indexshare::cli

#include <cstdint>
#include <vector>

#include "ref/config.h"
#include "ref/problem.h"
#include "tools/lib/options.h"  // resolve_impl, choose_impl, resolve_model_impl, parse_rows, Impl
#include "tools/lib/run_report.h"  // run's per-layer line (run, bench)

namespace indexshare::cli {

// --target: a Highway target for the simd path ("best" = Highway's choice); Error if unknown.
void apply_target(const std::string& target);
// --max-memory: the bytes a kernel-level stack of p allocates (inputs, logits when kept, outputs,
// all layers) for `n_rows` query rows (--rows; 0: all s_q rows): per-row tensors scale with
// n_rows, key-side ones (indexer k, attn kv) with s_kv; `golden` counts the second copy a golden
// set makes of every tensor. Logits not kept still exist one layer at a time unless `streams`
// (ref::layer_topk_streams: simd's fused indexer + top-k in FP8 mode). check_memory: Error naming
// the estimate, the budget and `remedies` (what the calling command offers to shrink the problem)
// when the estimate exceeds max_bytes.
uint64_t estimate_stack_bytes(const Problem& p, bool keep_logits, bool streams, int64_t n_rows = 0, bool golden = false);
void check_memory(const Problem& p, bool keep_logits, bool streams, uint64_t max_bytes, const std::string& remedies,
                  int64_t n_rows = 0, bool golden = false);
// --max-memory for --model: the bytes of the toy model with cfg's shapes, layers and seq (weights
// in f32, every layer's trace, which keeps its [seq, seq] indexer logits, and the caches), twice
// for a golden set. check_model_memory: Error naming the estimate, the budget and the remedies.
uint64_t estimate_model_bytes(const ModelConfig& cfg, bool golden);
void check_model_memory(const ModelConfig& cfg, uint64_t max_bytes, bool golden);
// The options given on a subcommand's command line (long names, "--seq"), for the checks below.
std::vector<std::string> given_options(const CLI::App& c);
bool was_given(const std::vector<std::string>& given, const std::string& name);
// Error naming the first of `names` that was given: "--seq applies to --model only (<why>)", so
// that an option the chosen mode does not read is never silently ignored.
void reject_given(const std::vector<std::string>& given, std::initializer_list<const char*> names,
                  const std::string& applies_to, const std::string& why);
// The rules that hang on which options are given, not on their values, declared to CLI11 (after
// the options are added): `opt` excludes each of `others` (both ways), or needs `other`. --help
// lists them; a breach is a usage error naming both options, exit 2. reject_given keeps the rules
// that hang on a value (--impl ref, --mode decode) or on what a file holds (a V4 dump).
void excludes(CLI::App& c, const std::string& opt, std::initializer_list<const char*> others);
void needs(CLI::App& c, const std::string& opt, const std::string& other);
// --target where the computation resolved to ref (it would be read by nothing).
void reject_target_on_ref(const std::vector<std::string>& given, Impl impl);
// An option's --help text from the table the Python package shares (option_table, tools/lib/options.h).
inline std::string help(const char* command, const char* cli) { return option_spec(command, cli).meaning; }
// --layers, --seq and --seed overrides, when given: in their option_table ranges (layers [1, 10^6],
// seq [1, 2^31 - 1], seed >= 0: a negative seed was taken as "not given").
void check_overrides(const std::vector<std::string>& given, int64_t layers, int64_t seq, int64_t seed);
// Adds checks to the options of `app`'s subcommands: an integer must fit in int64 (CLI11 2.1
// saturates 99999999999999999999 to 2^63 - 1 without a word); a text value must not be empty
// (--json "" meant "no JSON", --problem "" the default problem).
void strict_values(CLI::App& app);
// `streams` for the kernels of a resolved --impl.
bool impl_streams(Impl impl, const Problem& p);
// The start of check_memory's remedies for a command with --impl (and --no-logits when
// `offers_no_logits`): "--no-logits, " where logits are kept, with " with --impl simd (the indexer
// then streams)" or on its own "--impl simd (streams the indexer), " where the FP8 indexer does
// not stream yet and streaming would bring the estimate within max_bytes; "" otherwise.
std::string logits_remedy(const Problem& p, bool keep_logits, bool streams, uint64_t max_bytes, int64_t n_rows,
                          bool golden, bool offers_no_logits);
// A renamed option: returns "NEW,OLD" for add_option, so CLI11 takes both spellings and reports the
// new one (given_options, reject_given and the messages name it), and records the pair for
// old_name_notices. One vocabulary: --model names a model preset (golden, run, cost, bench),
// --preset a golden preset, --layers a layer count, --layer-list a selection of layers.
std::string renamed(const std::string& command, const std::string& new_name, const std::string& old_name);
// The one-line notices for the old spellings given on this command line (argv[1] the command):
// "indexshare: --layers is now --layer-list; the old name works for this release\n" each.
std::string old_name_notices(int argc, const char* const* argv);
// Parses "8G", "512M", "1000000" (bytes); Error naming the text otherwise.
uint64_t parse_bytes(const std::string& text);

}  // namespace indexshare::cli
