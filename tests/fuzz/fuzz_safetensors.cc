// libFuzzer target: the strict safetensors reader (tools/lib/safetensors.h, parse_safetensors) on
// arbitrary bytes. A file the reader accepts must also satisfy the documented invariants (tensors
// in offset order tiling the data buffer, byte counts = numel * dtype size, typed access works) and
// survive a write/read round trip unchanged.
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/fuzz/fuzz_common.h"
#include "tools/lib/safetensors.h"

using namespace indexshare;

namespace {

void check_view(const io::TensorView& v) {
  const int64_t numel = shape_numel(v.shape);  // the reader checked that it does not overflow
  if (uint64_t(numel) * io::dtype_size(v.dtype) != v.bytes.size())
    fuzz::finding("tensor '" + v.name + "': " + std::to_string(v.bytes.size()) + " bytes for shape " +
                  shape_str(v.shape) + " and dtype " + io::dtype_name(v.dtype));
  // Typed access of the matching element type must not throw.
  switch (v.dtype) {
    case io::DType::F64: (void)io::as_tensor<double>(v, "fuzz"); break;
    case io::DType::F32: (void)io::as_tensor<float>(v, "fuzz"); break;
    case io::DType::BF16: (void)io::as_tensor<bf16_t>(v, "fuzz"); break;
    case io::DType::F8_E4M3: (void)io::as_tensor<e4m3_t>(v, "fuzz"); break;
    case io::DType::I64: (void)io::as_tensor<int64_t>(v, "fuzz"); break;
    case io::DType::I32: (void)io::as_tensor<int32_t>(v, "fuzz"); break;
    case io::DType::U8: (void)io::as_tensor<uint8_t>(v, "fuzz"); break;
    default: break;
  }
  // ... and a mismatching one must be refused with Error.
  if (v.dtype != io::DType::F32) {
    bool refused = false;
    try {
      (void)io::as_tensor<float>(v, "fuzz");
    } catch (const Error&) {
      refused = true;
    }
    if (!refused) fuzz::finding("tensor '" + v.name + "': as_tensor<float> accepted dtype " + io::dtype_name(v.dtype));
  }
}

void round_trip(const io::SafetensorsFile& f) {
  static const std::string path = fuzz::scratch_dir("fuzz_safetensors") + "/rt.safetensors";
  try {
    io::write_safetensors(path, f.tensors, f.metadata);
  } catch (const Error&) {
    return;  // the writer is allowed to be stricter (e.g. about names); a refusal is not a finding
  }
  io::SafetensorsFile back;
  try {
    back = io::read_safetensors(path);
  } catch (const Error& e) {
    fuzz::finding(std::string("the reader refuses what the writer wrote: ") + e.what());
  }
  if (back.metadata != f.metadata) fuzz::finding("round trip changed the metadata");
  if (back.tensors.size() != f.tensors.size()) fuzz::finding("round trip changed the tensor count");
  for (const io::TensorView& v : f.tensors) {
    const io::TensorView* w = back.find(v.name);
    if (!w || w->dtype != v.dtype || w->shape != v.shape || w->bytes != v.bytes)
      fuzz::finding("round trip changed tensor '" + v.name + "'");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::guarded("fuzz_safetensors", [&] {
    const io::SafetensorsFile f = io::parse_safetensors(data, size, "fuzz.safetensors");
    uint64_t total = 0;
    for (const io::TensorView& v : f.tensors) {
      check_view(v);
      if (f.find(v.name) != &v) fuzz::finding("duplicate tensor name '" + v.name + "' accepted");
      total += v.bytes.size();
    }
    const uint64_t header = size >= 8 ? [&] { uint64_t n; std::memcpy(&n, data, 8); return n; }() : 0;
    if (8 + header + total != size) fuzz::finding("accepted tensors do not tile the data buffer");
    round_trip(f);
  });
  return 0;
}
