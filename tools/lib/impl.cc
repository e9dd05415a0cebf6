// The computation path (tools/lib/impl.h).
#include "tools/lib/impl.h"

#include "simd/simd.h"

namespace indexshare {

std::string impl_name(Impl impl) { return impl == Impl::simd ? "simd" : "ref"; }

std::optional<Impl> impl_named(const std::string& name) {
  for (Impl impl : {Impl::ref, Impl::simd})
    if (name == impl_name(impl)) return impl;
  return std::nullopt;
}

ref::Kernels kernels_for(Impl impl) { return impl == Impl::simd ? simd::kernels() : ref::Kernels{}; }

}  // namespace indexshare
