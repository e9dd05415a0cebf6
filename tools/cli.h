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
Action register_verify(CLI::App& app);
Action register_diff(CLI::App& app);
Action register_overlap(CLI::App& app);
Action register_search(CLI::App& app);
Action register_bench(CLI::App& app);

}  // namespace indexshare::cli

#include "ref/problem.h"

namespace indexshare::cli {

// --impl: "ref", "simd", or "auto" (simd when the indexer work of the problem exceeds about
// 2^28 multiply-accumulates, where ref takes a second or more). Returns "ref" or "simd".
std::string resolve_impl(const std::string& impl, const Problem& p);
// --target: a Highway target for the simd path ("best" = Highway's choice); Error if unknown.
void apply_target(const std::string& target);
// --max-memory: the bytes a kernel-level stack of p allocates (inputs, logits when kept, outputs,
// all layers); Error naming the estimate and the budget when it exceeds max_bytes.
uint64_t estimate_stack_bytes(const Problem& p, bool keep_logits);
void check_memory(const Problem& p, bool keep_logits, uint64_t max_bytes);
// Parses "8G", "512M", "1000000" (bytes); Error naming the text otherwise.
uint64_t parse_bytes(const std::string& text);

}  // namespace indexshare::cli
