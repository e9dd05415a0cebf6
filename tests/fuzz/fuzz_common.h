// Shared helpers of the libFuzzer targets (tests/fuzz/fuzz_*.cc).
//
// Contract of every target: indexshare::Error is the documented way to refuse bad input, so it is
// caught and ignored; any other exception, a crash, a leak, undefined behaviour, a timeout or a
// violated round-trip property is a finding (the target aborts, libFuzzer saves the input).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "ref/error.h"

namespace indexshare::fuzz {

// Reports a finding and aborts (libFuzzer writes the crash-<sha1> file).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Runs fn(); indexshare::Error is fine, anything else is a finding.
template <class F>
void guarded(const char* target, F&& fn) {
  try {
    fn();
  } catch (const Error&) {
    // refused cleanly: the documented behaviour for bad input
  } catch (const std::exception& e) {
    finding(std::string(target) + ": exception other than indexshare::Error: " + e.what());
  } catch (...) {
    finding(std::string(target) + ": non-std exception");
  }
}

// A per-process scratch folder under $TMPDIR (default /tmp), removed at exit.
std::string scratch_dir(const char* target);

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace indexshare::fuzz
