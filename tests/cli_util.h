// Test helper: runs the indexshare CLI (path INDEXSHARE_CLI) and captures its output.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace indexshare::testing {

struct CliResult {
  int status;       // exit status; under a timeout 124 means it timed out; -1 killed by a signal
  std::string out;  // stdout and stderr together
};

// `timeout_s` > 0 runs the command under coreutils `timeout`.
inline CliResult run_cli(const std::string& args, int timeout_s = 0) {
  const std::string prefix = timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : std::string();
  const std::string cmd = prefix + std::string(INDEXSHARE_CLI) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace indexshare::testing
