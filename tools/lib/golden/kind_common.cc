// golden sets: what the kinds with their own tensor list share (v4, mtp, hyv4, kpool; the manifest
// head also decode-model1 and the kernel-level stack): the manifest's head, a descriptor's count
// fields and the base of their manifest checks (KindCheck, tools/lib/golden/internal.h).

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include "ref/error.h"

namespace indexshare::golden::detail {

using nlohmann::json;

json manifest_head(const std::string& kind, const std::string& problem, const std::string& replay, Impl impl) {
  return {
      {"format", "indexshare-golden"},
      {"format_version", kFormatVersion},
      {"generator", std::string("indexshare ") + INDEXSHARE_VERSION + " (" + impl_name(impl) + ")"},
      {"kind", kind},
      {"problem", problem},
      {"replay", replay},
  };
}

int64_t descriptor_count(const std::string& what, const std::string& field, const std::string& text) {
  require(!text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos,
          what + " field '" + field + "': '" + text + "' is not a non-negative integer");
  return std::stoll(text);
}

KindCheck::KindCheck(const Loaded& g, const std::string& mpath) : g_(g), m_(g.manifest), mpath_(mpath) {
  if (m_.contains("tensors"))
    for (const json& t : m_["tensors"]) roles_[t["name"].get<std::string>()] = t["role"].get<std::string>();
}

void KindCheck::fail(const std::string& field, const std::string& what) const {
  throw Error(mpath_ + ": field '" + field + "' " + what);
}

int64_t KindCheck::int_field(const json& c, const std::string& f, int64_t lo, int64_t hi) const {
  const std::string field = "config." + f;
  if (!c.contains(f) || !c[f].is_number_integer()) fail(field, "is missing or not an integer");
  if (c[f].is_number_unsigned() && c[f].get<uint64_t>() > uint64_t(hi)) fail(field, "must be <= " + std::to_string(hi));
  const int64_t v = c[f].get<int64_t>();
  if (v < lo || v > hi) fail(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
  return v;
}

void KindCheck::expect_tensor(const std::string& name, io::DType dtype, const Shape& want, Role role,
                              const std::string& holder, std::optional<io::DType> also) {
  expected_.insert(name);
  const io::TensorView* v = g_.find(name);
  if (!v) fail("tensors", "lacks '" + name + "' (a " + holder + " layer holds it)");
  if ((v->dtype != dtype && !(also && v->dtype == *also)) || v->shape != want)
    fail("tensors", "'" + name + "' is " + io::dtype_name(v->dtype) + " " + shape_str(v->shape) + ", the config gives " +
                        io::dtype_name(dtype) + " " + shape_str(want));
  const std::string& listed = roles_[name];
  if (listed != role_name(role)) fail("tensors", "'" + name + "' has role " + listed + ", not " + role_name(role));
}

void KindCheck::no_other_tensors(const std::string& a_set) const {
  for (const auto& [name, role] : roles_)
    if (!expected_.count(name)) fail("tensors", "names '" + name + "', which " + a_set + " does not hold");
}

}  // namespace indexshare::golden::detail
