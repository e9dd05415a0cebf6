// Test helper of the simd tests (tests/test_simd.cc, tests/test_simd_numerics.cc): every compiled
// and supported Highway target with 1 and 2 OpenMP threads, and bit-for-bit comparisons.
#pragma once

#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "ref/error.h"
#include "ref/tensor.h"
#include "simd/simd.h"

namespace indexshare::simd_test {


constexpr float kInf = std::numeric_limits<float>::infinity();

// Restores Highway's own target choice and the OpenMP thread count, also when a check fails.
struct TargetGuard {
  int threads = omp_get_max_threads();
  ~TargetGuard() {
    hwy::SetSupportedTargetsForTest(0);
    omp_set_num_threads(threads);
  }
};

// fn(target name, threads) on every compiled and supported target, with 1 and 2 threads.
template <class Fn>
void for_each_target(Fn&& fn) {
  TargetGuard guard;
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  REQUIRE(!targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = hwy::TargetName(target);
    CAPTURE(name);
    REQUIRE(simd::current_target() == name);
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      omp_set_num_threads(threads);
      fn(name, threads);
    }
  }
}

// Equal bits, or both NaN (a NaN's sign and payload are whatever the hardware propagates).
inline bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Index of the first element whose bits differ, or -1.
inline int64_t first_diff(const Tensor<float>& a, const Tensor<float>& b) {
  REQUIRE(a.shape == b.shape);
  for (int64_t i = 0; i < a.numel(); ++i)
    if (!same_bits(a[i], b[i])) return i;
  return -1;
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace indexshare::simd_test
