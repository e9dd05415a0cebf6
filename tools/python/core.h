// indexshare._core: what the extension's files share (tools/python/_core.cc, _core_module.cc): the
// argument arrays (In, InN) borrowed as tensors without a copy, results handed to numpy without a
// copy, the GIL released around a kernel (timed), and the per-thread records the Python tests and
// the overhead benchmark read (last_input_pointers, last_kernel_seconds). Not a public header.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ref/tensor.h"

namespace nb = nanobind;

namespace indexshare::core {


template <class Raw>
using In = nb::ndarray<const Raw, nb::c_contig, nb::device::cpu>;
// The same with its rank fixed: an argument of the Python fast path (indexshare/kernels.py topk), which
// hands the caller's arrays straight to C++; bound with .noconvert(), nanobind refuses (TypeError)
// instead of converting anything else, and the Python layer then takes its checked path.
template <class Raw, size_t N>
using InN = nb::ndarray<const Raw, nb::ndim<N>, nb::c_contig, nb::device::cpu>;

// A C-contiguous CPU array of Raw elements as a Tensor<T> (T has Raw's size: bf16_t/uint16, ...),
// without a copy: a read-only view of the array's memory (ref/tensor.h BorrowedTensor). The
// ndarray argument holds a reference to the Python object for the whole call, so the memory
// outlives the kernel; the Python layer has made the array C-contiguous (copying a non-contiguous
// one there, once).
template <class T, class Array>
BorrowedTensor<T> borrow(const Array& a) {
  static_assert(sizeof(T) == sizeof(typename Array::Scalar));
  Shape shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i)));
  return BorrowedTensor<T>(std::move(shape), reinterpret_cast<const T*>(a.data()));
}

template <class T, class Raw>
std::optional<BorrowedTensor<T>> borrow_optional(const std::optional<In<Raw>>& a) {
  if (!a) return std::nullopt;
  return borrow<T>(*a);
}

// The data pointers of the input tensors the last kernel call of this thread handed to its kernel,
// in argument order (0 for an absent optional one): the zero-copy test (tests/python/test_kernels.py)
// compares them with the caller's arrays' pointers.
inline thread_local std::vector<uintptr_t> last_input_pointers;

template <class... Ts>
void note_inputs(const Ts*... ts) {
  last_input_pointers = {(ts ? reinterpret_cast<uintptr_t>(ts->ptr()) : uintptr_t{0})...};
}

// Moves `t` to the heap and returns a numpy array over its storage (no copy); the capsule frees it.
template <class Raw, class T>
nb::object to_numpy(Tensor<T>&& t) {
  static_assert(sizeof(T) == sizeof(Raw));
  auto* held = new Tensor<T>(std::move(t));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor<T>*>(p); });
  std::vector<size_t> shape(held->shape.begin(), held->shape.end());
  return nb::cast(nb::ndarray<nb::numpy, Raw>(reinterpret_cast<Raw*>(held->data.data()), shape.size(), shape.data(), owner));
}

// Seconds the last kernel call of this thread spent in C++ computing (the GIL released), for the
// overhead benchmark (tools/python/bench_overhead.py): a Python call's time less this is the binding's.
inline thread_local double last_kernel_seconds = 0;

// Runs f with the GIL released and records its time.
template <class F>
auto timed(F&& f) {
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = f();
  last_kernel_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The module-level bindings (tools/python/_core_module.cc): the norms, RoPE, Hadamard, linear and
// FP8 quantization steps, then the indexer and MLA steps of a layer.
void bind_module_ops(nb::module_& m);
void bind_module_steps(nb::module_& m);
// Hunyuan HY V4's indexer, gated attention and layer (tools/python/_core_hyv4.cc).
void bind_hyv4(nb::module_& m);

}  // namespace indexshare::core
