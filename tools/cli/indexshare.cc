// indexshare: the command-line tool. Subcommands live in tools/cmd_*.cc (see tools/cli/cli.h).
//
// Exit status: 0 success, 1 a check failed, 2 bad input or usage (the message names the file,
// tensor, field or token at fault), 3 internal error.
#include <malloc.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "ref/error.h"
#include "tools/cli/cli.h"
#include "tools/lib/phases.h"
#ifdef INDEXSHARE_MPI
#include "tools/lib/distributed.h"
#endif

namespace {

// Under an MPI launcher with several ranks, errors every rank meets alike (usage, bad input found
// before the ranks split the work) are printed by rank 0 only; errors of one rank go through the
// collective checks of tools/lib/distributed.h, which print them on rank 0.
bool quiet_rank() {
#ifdef INDEXSHARE_MPI
  return indexshare::dist::active() && indexshare::dist::rank() != 0;
#else
  return false;
#endif
}

int run(int argc, char** argv) {
  using namespace indexshare;
  // Keep freed blocks up to 32 MiB (glibc's maximum) in the heap instead of returning each one to
  // the OS: kernels called in a loop (bench repeats, stacks) would otherwise fault and zero their
  // scratch pages again on every call. Performance only.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  CLI::App app{"indexshare: CPU reference and correctness oracle for DeepSeek Sparse Attention "
               "with cross-layer index sharing"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(INDEXSHARE_VERSION));
  const std::vector<cli::Action> actions = {
      cli::register_run(app), cli::register_golden(app), cli::register_presets(app), cli::register_kernels(app),
      cli::register_verify(app), cli::register_diff(app), cli::register_overlap(app),
      cli::register_search(app), cli::register_bench(app), cli::register_cost(app),
      cli::register_calibrate(app), cli::register_explain(app)};
  cli::strict_values(app);
  // A first word that is neither an option nor a command: name it (CLI11 says only that a
  // subcommand is required).
  if (argc > 1 && argv[1][0] != '-' && app.get_subcommands([&](CLI::App* s) { return s->get_name() == argv[1]; }).empty()) {
    std::string names;
    for (const CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) names += (names.empty() ? "" : ", ") + s->get_name();
    if (!quiet_rank()) std::fprintf(stderr, "indexshare: error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
    return 2;
  }
  if (!quiet_rank()) std::fputs(cli::old_name_notices(argc, argv).c_str(), stderr);  // renamed options
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return quiet_rank() ? 0 : app.exit(e);  // --help, --version
    // Usage errors read like every other bad input: the prefix, the option or token at fault.
    if (!quiet_rank()) std::fprintf(stderr, "indexshare: error: %s (see indexshare --help, or indexshare COMMAND --help)\n", e.what());
    return 2;
  }
#ifdef INDEXSHARE_MPI
  // Commands that do not split their work across ranks run on rank 0 alone.
  if (quiet_rank()) {
    const std::string name = app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name();
    if (name != "golden" && name != "run" && name != "overlap" && name != "search") return 0;
  }
#endif
  try {
    for (const cli::Action& a : actions) {
      const int rc = a();
      if (rc >= 0) return rc;
    }
  } catch (const Error& e) {
    if (!quiet_rank()) std::fprintf(stderr, "indexshare: error: %s\n", e.what());
    return 2;
#ifdef INDEXSHARE_MPI
  } catch (const dist::Failed&) {  // printed by rank 0 already
    return 2;
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "indexshare: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef INDEXSHARE_MPI
  indexshare::phases::begin("MPI_Init");
  indexshare::dist::init(&argc, &argv);
  indexshare::phases::begin("setup (arguments, problem, split)");
  const int rc = run(argc, argv);
  indexshare::dist::finalize();
  return rc;
#else
  return run(argc, argv);
#endif
}
