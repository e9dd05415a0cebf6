#include "tools/cli.h"
namespace indexshare::cli {
Action register_bench(CLI::App&) { return [] { return -1; }; }
}
