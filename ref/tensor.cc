#include "ref/tensor.h"

#include <limits>

namespace indexshare {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {  // messages are built only on failure (a hostile rank stays linear)
    if (d < 0) throw Error("shape " + shape_str(shape) + ": negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw Error("shape " + shape_str(shape) + ": element count overflows int64");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

}  // namespace indexshare
