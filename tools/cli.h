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
