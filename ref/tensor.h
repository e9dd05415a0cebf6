// indexshare: a minimal dense tensor for the reference path.
//
// Tensor<T> is a row-major array with a shape; element (i0, i1, ..., in) lives at
// ((i0 * d1 + i1) * d2 + ...) * dn + in. Storage types for the low-precision formats are
// distinct structs so that a bf16 code can never be mistaken for an integer:
//   bf16_t  : the 16-bit bfloat16 code (sign, 8 exponent bits, 7 mantissa bits)
//   e4m3_t  : the 8-bit float8_e4m3fn code (sign, 4 exponent bits, 3 mantissa bits, bias 7)
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ref/error.h"

namespace indexshare {

struct bf16_t {
  uint16_t bits = 0;
  friend bool operator==(bf16_t a, bf16_t b) { return a.bits == b.bits; }
};
struct e4m3_t {
  uint8_t bits = 0;
  friend bool operator==(e4m3_t a, e4m3_t b) { return a.bits == b.bits; }
};

using Shape = std::vector<int64_t>;

// Asks the OS to back [p, p + bytes) with transparent huge pages when the region spans at least
// a few of them (Linux madvise(MADV_HUGEPAGE) on the 2 MiB-aligned interior; a no-op elsewhere or
// when refused). Performance only, never results: kernels that gather rows of a large tensor
// (the sparse attention reading top-k rows of kv) otherwise pay a TLB miss per row, which made
// simd attention's logits pass 3.3x slower at 16K keys on the development machine.
void advise_huge_pages(void* p, size_t bytes);

// Number of elements of a shape; throws on negative dimensions or on overflow of int64.
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

template <typename T>
struct Tensor {
  Shape shape;
  std::vector<T> data;

  Tensor() = default;
  // Reserves first, advises huge pages, then fills: the fill is what touches the pages.
  explicit Tensor(Shape s, T fill = T{}) : shape(std::move(s)) {
    const size_t n = size_t(shape_numel(shape));
    data.reserve(n);
    advise_huge_pages(data.data(), n * sizeof(T));
    data.assign(n, fill);
  }

  int64_t numel() const { return int64_t(data.size()); }
  int rank() const { return int(shape.size()); }
  int64_t dim(int i) const { return shape.at(size_t(i)); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
  T& operator[](int64_t i) { return data[size_t(i)]; }
  const T& operator[](int64_t i) const { return data[size_t(i)]; }
  // Row-major element access for rank 2 and 3.
  T& at(int64_t i, int64_t j) { return data[size_t(i * shape[1] + j)]; }
  const T& at(int64_t i, int64_t j) const { return data[size_t(i * shape[1] + j)]; }
  T& at(int64_t i, int64_t j, int64_t k) { return data[size_t((i * shape[1] + j) * shape[2] + k)]; }
  const T& at(int64_t i, int64_t j, int64_t k) const {
    return data[size_t((i * shape[1] + j) * shape[2] + k)];
  }
};

// Throws Error("<what>: expected shape [..], got [..]") when t's shape differs from `expected`.
template <typename T>
void require_shape(const Tensor<T>& t, const Shape& expected, const std::string& what) {
  if (t.shape != expected)
    throw Error(what + ": expected shape " + shape_str(expected) + ", got " + shape_str(t.shape));
}

}  // namespace indexshare
