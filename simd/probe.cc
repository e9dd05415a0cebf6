// indexshare simd/: the FMA peak probe behind `indexshare bench`'s "share of peak" column.
//
// Each OpenMP thread runs kChains independent chains acc = acc * m + a (one double-precision
// MulAdd per chain per step, a full vector of lanes each). With more chains than FMA latency x
// FMA ports (4 x 2 = 8 on AVX-512 cores), the loop is bound by FMA throughput, which is the peak
// the kernels are measured against. m is slightly below 1 and a small, so every chain converges
// to a / (1 - m) and stays a normal number (no overflow, no denormal slow path). m and a come
// from the caller at run time and every accumulator is summed into the result, so the compiler
// can neither fold nor drop the loop.
//
// Timing: the step count is calibrated (doubled until one pass takes >= 20 ms, then scaled to
// ~0.1 s), then the pass runs kTrials times and the fastest counts (a peak is a best case; on a
// shared machine slower trials measure the neighbours). FLOPs = 2 per lane per MulAdd.
// The probe always runs on the best target (Highway's own choice), whatever set_target narrowed
// the dispatch to, and restores that narrowing afterwards.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/probe.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kChains = 16;  // 32 vector registers
#else
constexpr size_t kChains = 12;  // 16 vector registers: 12 chains + m + a
#endif

// Runs `steps` steps of every chain; returns the sum of all lanes of all chains. Adds the lanes
// per step to *flops_per_step (2 flops per lane per MulAdd).
double FmaChains(int64_t steps, double m, double a, double* flops_per_step) {
  const hn::ScalableTag<double> d;
  using V = hn::Vec<decltype(d)>;
  const V vm = hn::Set(d, m);
  const V va = hn::Set(d, a);
  V acc[kChains];
  for (size_t c = 0; c < kChains; ++c) acc[c] = hn::Set(d, double(c));
  for (int64_t i = 0; i < steps; ++i) {
    for (size_t c = 0; c < kChains; ++c) acc[c] = hn::MulAdd(acc[c], vm, va);
  }
  V sum = hn::Zero(d);
  for (size_t c = 0; c < kChains; ++c) sum = hn::Add(sum, acc[c]);
  *flops_per_step = 2.0 * double(kChains) * double(hn::Lanes(d));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "hwy/targets.h"
#include "ref/error.h"
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(FmaChains);

namespace {

// Multiplier and addend, read through volatiles so that they are run-time values.
volatile double g_probe_m = 1.0 - 1.0 / 1048576.0;
volatile double g_probe_a = 1.0 / 1024.0;
volatile double g_probe_sink = 0.0;

// One pass on `threads` threads: returns (seconds, flops); the lane sums go to g_probe_sink.
struct Pass {
  double seconds = 0, flops = 0;
};
Pass run_pass(int threads, int64_t steps) {
  const double m = g_probe_m, a = g_probe_a;
  double total = 0, flops_per_step = 0;
  int team = 1;  // the threads OpenMP really gave (it may give fewer than asked)
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    double fps = 0;
    total += HWY_DYNAMIC_DISPATCH(FmaChains)(steps, m, a, &fps);
    if (omp_get_thread_num() == 0) {
      flops_per_step = fps;
      team = omp_get_num_threads();
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  g_probe_sink = g_probe_sink + total;
  return {seconds, flops_per_step * double(steps) * double(team)};
}

}  // namespace

double fma_peak_gflops(int threads) {
  require(threads >= 1, "fma_peak_gflops: threads must be >= 1, got " + std::to_string(threads));
  // Measure on the best target: lift a set_target narrowing for the duration, then restore it.
  const int64_t narrowed = hwy::SupportedTargets();
  hwy::SetSupportedTargetsForTest(0);
  const int64_t all = hwy::SupportedTargets();
  struct Restore {
    int64_t mask;
    ~Restore() {
      if (mask) hwy::SetSupportedTargetsForTest(mask);
    }
  } restore{narrowed != all ? narrowed : 0};

  constexpr double kCalibrate = 0.02, kTarget = 0.1;
  constexpr int kTrials = 3;
  int64_t steps = 1 << 16;
  Pass p = run_pass(threads, steps);
  while (p.seconds < kCalibrate && steps < (int64_t(1) << 40)) {
    steps *= 2;
    p = run_pass(threads, steps);
  }
  steps = std::max<int64_t>(1, int64_t(double(steps) * kTarget / std::max(p.seconds, 1e-9)));
  double best = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    p = run_pass(threads, steps);
    best = std::max(best, p.flops / p.seconds / 1e9);
  }
  require(std::isfinite(g_probe_sink), "fma_peak_gflops: the probe's chains did not stay finite");
  return best;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
