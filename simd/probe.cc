// placeholder: fma_peak_gflops
#include "simd/simd.h"
namespace indexshare::simd { double fma_peak_gflops(int) { return 0; } }
