#include "tests/fuzz/fuzz_common.h"

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <vector>

namespace indexshare::fuzz {

namespace {
std::vector<std::filesystem::path>& dirs() {
  static std::vector<std::filesystem::path> d;
  return d;
}
void remove_dirs() {
  std::error_code ec;
  for (const auto& d : dirs()) std::filesystem::remove_all(d, ec);
}
}  // namespace

std::string scratch_dir(const char* target) {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path base = tmp && *tmp ? tmp : "/tmp";
  const std::filesystem::path d = base / ("indexshare-" + std::string(target) + "-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::remove_all(d, ec);
  std::filesystem::create_directories(d);
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(remove_dirs); });
  dirs().push_back(d);
  return d.string();
}

}  // namespace indexshare::fuzz
