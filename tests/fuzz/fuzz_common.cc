#include "tests/fuzz/fuzz_common.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
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
  const std::string prefix = "indexshare-" + std::string(target) + "-";
  const std::filesystem::path d = base / (prefix + std::to_string(::getpid()));
  std::error_code ec;
  // A crashed run (abort skips atexit) leaves its folder behind: remove those of dead processes.
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
    if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
  }
  std::filesystem::remove_all(d, ec);
  std::filesystem::create_directories(d);
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(remove_dirs); });
  dirs().push_back(d);
  return d.string();
}

}  // namespace indexshare::fuzz
