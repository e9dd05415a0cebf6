// C entry points over ref/numerics for the Python interop tests (ctypes). Array versions so
// that a sweep over billions of inputs costs one call per chunk.
#include <cstddef>
#include <cstdint>

#include "ref/numerics.h"

extern "C" {

void indexshare_f32_to_bf16(const float* x, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = indexshare::f32_to_bf16(x[i]).bits;
}

void indexshare_f32_to_e4m3(const float* x, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = indexshare::f32_to_e4m3(x[i]).bits;
}

void indexshare_e4m3_to_f32(const uint8_t* x, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = indexshare::e4m3_to_f32(indexshare::e4m3_t{x[i]});
}

void indexshare_bf16_to_f32(const uint16_t* x, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = indexshare::bf16_to_f32(indexshare::bf16_t{x[i]});
}

}  // extern "C"
