// Test helper of the hostile-input suites (tests/test_hostile.cc, tests/test_hostile_limits.cc):
// the CLI under a timeout, the refusal check (exit 2, the message's needles, no crash report), a
// temporary folder, and file bytes.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"

namespace indexshare::hostile {

namespace fs = std::filesystem;

using Result = indexshare::testing::CliResult;

// Runs the CLI with `args` under `timeout SECONDS`: a timeout shows up as status 124, a crash as
// 128 + the signal (the shell's convention) or -1.
inline Result cli(const std::string& args, int seconds = 60) { return indexshare::testing::run_cli(args, seconds); }

inline bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Checks a refusal: exit 2, every needle in the message, no crash report.
inline void refused(const Result& r, const std::vector<std::string>& needles) {
  INFO("output: " << (r.out.size() > 2000 ? r.out.substr(0, 1000) + " [...] " + r.out.substr(r.out.size() - 1000) : r.out));
  CHECK(r.status == 2);
  CHECK(has(r.out, "indexshare: error: "));
  for (const std::string& n : needles) CHECK_MESSAGE(has(r.out, n), "missing '" << n << "'");
  CHECK_FALSE(has(r.out, "internal error"));
  CHECK_FALSE(has(r.out, "Sanitizer"));
}

inline std::string golden_dir(const std::string& name) { return std::string(INDEXSHARE_SOURCE_DIR) + "/golden/" + name; }
inline const std::string kEdge = golden_dir("attention-edge");

struct TmpDir {
  fs::path path;
  TmpDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("indexshare-hostile-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // The names in the folder, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace indexshare::hostile
