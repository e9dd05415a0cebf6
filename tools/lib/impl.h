// indexshare: the computation path as one value. Impl::ref runs ref/'s scalar kernels, Impl::simd
// simd/'s Highway + OpenMP ones (simd/simd.h), which return the same bits. The front ends turn
// --impl / impl= into an Impl once (tools/lib/options.h); everything after takes the Impl, its
// kernel table (kernels_for) and its name (impl_name) from here.
#pragma once

#include <optional>
#include <string>

#include "ref/kernels.h"

namespace indexshare {

enum class Impl { ref, simd };

// "ref" or "simd": the word --impl takes, as messages, JSON reports and replay lines print it.
std::string impl_name(Impl impl);
// The Impl impl_name gives `name`; nullopt for any other text ("auto" included).
std::optional<Impl> impl_named(const std::string& name);
// The kernel table of the path: ref::Kernels{} (ref/kernels.h) or simd::kernels().
ref::Kernels kernels_for(Impl impl);

}  // namespace indexshare
