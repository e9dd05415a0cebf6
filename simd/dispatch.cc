// indexshare simd/: target selection. Every simd entry point dispatches once per tensor op through
// HWY_DYNAMIC_DISPATCH, which picks the best target among those compiled here and allowed by
// hwy::SupportedTargets(); set_target narrows that set with hwy::SetSupportedTargetsForTest.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/dispatch.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {

// The target this copy of the code was compiled for: dispatching to it reports the current choice.
int64_t TargetId() { return HWY_TARGET; }

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "ref/error.h"
#include "simd/simd.h"

namespace indexshare::simd {

HWY_EXPORT(TargetId);

std::vector<std::string> compiled_targets() {
  std::vector<std::string> names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

void set_target(const std::string& name) {
  // Look the name up in the unrestricted set, so that one set_target can follow another.
  hwy::SetSupportedTargetsForTest(0);
  if (name == "best") return;
  std::string known;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      return;
    }
    known += (known.empty() ? "" : ", ") + std::string(hwy::TargetName(t));
  }
  throw Error("simd target: unknown or unsupported target '" + name + "' (expected best or one of: " +
              known + ")");
}

std::string current_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetId)()); }

}  // namespace indexshare::simd
#endif  // HWY_ONCE
