// indexshare: a minimal dense tensor for the reference path.
//
// Tensor<T> is a row-major array with a shape; element (i0, i1, ..., in) lives at
// ((i0 * d1 + i1) * d2 + ...) * dn + in. Storage types for the low-precision formats are
// distinct structs so that a bf16 code can never be mistaken for an integer:
//   bf16_t  : the 16-bit bfloat16 code (sign, 8 exponent bits, 7 mantissa bits)
//   e4m3_t  : the 8-bit float8_e4m3fn code (sign, 4 exponent bits, 3 mantissa bits, bias 7)
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
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
// Room for n elements in `c` (a Storage or a std::vector), advised as above before anything
// touches it: the fill that follows (assign, resize) is what faults the pages in.
template <class C>
void reserve_advised(C& c, size_t n) {
  c.reserve(n);
  advise_huge_pages(c.data(), n * sizeof(typename C::value_type));
}

// Number of elements of a shape; throws on negative dimensions or on overflow of int64.
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);
// The multi-dimensional index of row-major element `flat` of a tensor of `shape`.
std::vector<int64_t> unflatten(int64_t flat, const Shape& shape);

// The elements of a Tensor: a std::vector<T> (every vector operation the code base uses, and
// comparison with and assignment from std::vector<T>), with one addition: it may instead BORROW
// memory it does not own, read-only, so that a caller's array reaches the kernels without a copy
// (the Python package's contiguous numpy / torch inputs, tools/python/_core.cc).
//   owning   (every Storage the code makes): a std::vector<T>.
//   borrowed (only inside a BorrowedTensor, below): a view of [p, p + n), memory that the creator
//            keeps alive and unchanged for the view's lifetime, or that the view keeps alive
//            itself through a shared owner (a file mapping: tools/lib/safetensors.h). A
//            BorrowedTensor hands its tensor out as const only, so nothing can write through the
//            view; copying a borrowed Storage gives an owning one holding a copy, and the mutating
//            members (resize, assign, insert, reserve, push_back, clear) first make it owning, so
//            the borrowed memory is never written. The non-const element accessors (data, [],
//            begin, end) do not check (they are the kernels' inner loops); an assert catches their
//            use on a borrowed view in debug builds.
// Invariant: p_ / n_ are the elements in both modes (owning: own_.data() / own_.size()), so an
// element access costs what a vector's does.
template <typename T>
class Storage {
 public:
  using value_type = T;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;

  Storage() = default;
  Storage(std::vector<T> v) : own_(std::move(v)) { sync(); }  // NOLINT: implicit, as a vector
  Storage(std::initializer_list<T> values) : own_(values) { sync(); }
  Storage(const Storage& o) : own_(o.begin(), o.end()) { sync(); }
  Storage(Storage&& o) noexcept
      : own_(std::move(o.own_)), keep_(std::move(o.keep_)), p_(o.p_), n_(o.n_), borrowed_(o.borrowed_) {
    if (!borrowed_) sync();
    o.sync();
  }
  Storage& operator=(const Storage& o) {
    if (this != &o) {
      own_.assign(o.begin(), o.end());
      sync();
    }
    return *this;
  }
  Storage& operator=(Storage&& o) noexcept {
    if (this != &o) {
      own_ = std::move(o.own_);
      keep_ = std::move(o.keep_);
      p_ = o.p_;
      n_ = o.n_;
      borrowed_ = o.borrowed_;
      if (!borrowed_) sync();
      o.own_.clear();
      o.sync();
    }
    return *this;
  }
  Storage& operator=(std::vector<T> v) {
    own_ = std::move(v);
    sync();
    return *this;
  }
  Storage& operator=(std::initializer_list<T> values) {
    own_.assign(values);
    sync();
    return *this;
  }

  // True for a view of memory this Storage does not own (BorrowedTensor).
  bool borrowed() const { return borrowed_; }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const T* data() const { return p_; }
  T* data() {
    assert(!borrowed_ && "write access to a borrowed (read-only) Storage");
    return p_;
  }
  const T& operator[](size_t i) const { return p_[i]; }
  T& operator[](size_t i) { return data()[i]; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }
  const T* cbegin() const { return p_; }
  const T* cend() const { return p_ + n_; }
  T* begin() { return data(); }
  T* end() { return data() + n_; }
  const T& front() const { return p_[0]; }
  const T& back() const { return p_[n_ - 1]; }

  // Mutators: as std::vector's, on an owning copy when this is borrowed.
  void reserve(size_t n) {
    own();
    own_.reserve(n);
    sync();
  }
  void resize(size_t n) {
    own();
    own_.resize(n);
    sync();
  }
  void resize(size_t n, const T& value) {
    own();
    own_.resize(n, value);
    sync();
  }
  void assign(size_t n, const T& value) {
    own_.assign(n, value);
    sync();
  }
  template <class It>
  void assign(It first, It last) {
    std::vector<T> v(first, last);  // [first, last) may lie in this Storage
    own_ = std::move(v);
    sync();
  }
  template <class It>
  T* insert(const T* pos, It first, It last) {
    const size_t at = size_t(pos - p_);
    std::vector<T> v(first, last);  // [first, last) may lie in this Storage
    own();
    own_.insert(own_.begin() + std::ptrdiff_t(at), v.begin(), v.end());
    sync();
    return p_ + at;
  }
  void push_back(const T& value) {
    own();
    own_.push_back(value);
    sync();
  }
  void clear() {
    own_.clear();
    sync();
  }

  // As a std::vector (a copy).
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

  friend bool operator==(const Storage& a, const Storage& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const Storage& a, const std::vector<T>& b) {
    return a.n_ == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  template <typename>
  friend class BorrowedTensor;
  Storage(const T* p, size_t n, std::shared_ptr<const void> keep)
      : keep_(std::move(keep)), p_(const_cast<T*>(p)), n_(n), borrowed_(true) {}

  void sync() {
    p_ = own_.data();
    n_ = own_.size();
    borrowed_ = false;
    keep_.reset();
  }
  // Makes a borrowed Storage owning (a copy of the view); a no-op when it owns.
  void own() {
    if (borrowed_) {
      own_.assign(p_, p_ + n_);
      sync();
    }
  }

  std::vector<T> own_;
  std::shared_ptr<const void> keep_;  // borrowed: what keeps [p_, p_ + n_) alive, if anything
  T* p_ = nullptr;
  size_t n_ = 0;
  bool borrowed_ = false;
};

template <typename T>
struct Tensor {
  Shape shape;
  Storage<T> data;

  Tensor() = default;
  // Reserves first, advises huge pages, then fills: the fill is what touches the pages.
  explicit Tensor(Shape s, T fill = T{}) : shape(std::move(s)) {
    const size_t n = size_t(shape_numel(shape));
    reserve_advised(data, n);
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

// A Tensor<T> over memory it does not own, for the kernels to read without a copy: `p` holds
// shape_numel(shape) elements, row-major, and the creator keeps them alive and unchanged while
// this (or any reference to its tensor) lives; or `keep` does: the view, and every Tensor it is
// moved into, holds it until the view goes (diff's tensors read from a mapped file). The tensor is
// only handed out as const (see Storage: nothing writes through it; a copy of it owns its elements). Moving a BorrowedTensor
// keeps the view.
template <typename T>
class BorrowedTensor {
 public:
  BorrowedTensor(Shape shape, const T* p, std::shared_ptr<const void> keep = nullptr) {
    const size_t n = size_t(shape_numel(shape));
    require(n == 0 || p != nullptr, "BorrowedTensor: null data for shape " + shape_str(shape));
    t_.shape = std::move(shape);
    t_.data = Storage<T>(p, n, std::move(keep));
  }
  const Tensor<T>& get() const { return t_; }
  operator const Tensor<T>&() const { return t_; }  // NOLINT: implicit, a const Tensor<T>
  // The view as a Tensor, still borrowed, for an aggregate of Tensors (ref::AttentionOut) that is
  // then only passed on as const: its mutators copy first (Storage, above).
  Tensor<T> take() && { return std::move(t_); }

 private:
  Tensor<T> t_;
};

// Throws Error("<what>: expected shape [..], got [..]") when t's shape differs from `expected`.
template <typename T>
void require_shape(const Tensor<T>& t, const Shape& expected, const std::string& what) {
  if (t.shape != expected)
    throw Error(what + ": expected shape " + shape_str(expected) + ", got " + shape_str(t.shape));
}

}  // namespace indexshare
