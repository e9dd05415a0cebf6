// indexshare cost: placeholder until the cost model lands.
#include "tools/cli.h"

namespace indexshare::cli {
Action register_cost(CLI::App&) { return [] { return -1; }; }
}  // namespace indexshare::cli
