#include "kusari/core/dtype.h"

namespace kusari {

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kBool:
      return "bool";
    case Dtype::kUInt8:
      return "uint8";
    case Dtype::kInt32:
      return "int32";
    case Dtype::kInt64:
      return "int64";
    case Dtype::kFloat16:
      return "float16";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kFloat64:
      return "float64";
  }
  return "invalid";
}

Dtype dtype_from_name(const std::string& name) {
  for (Dtype d : {Dtype::kBool, Dtype::kUInt8, Dtype::kInt32, Dtype::kInt64, Dtype::kFloat16, Dtype::kBFloat16,
                  Dtype::kFloat32, Dtype::kFloat64}) {
    if (name == dtype_name(d)) return d;
  }
  if (name == "half") return Dtype::kFloat16;
  if (name == "float") return Dtype::kFloat32;
  if (name == "double") return Dtype::kFloat64;
  KUSARI_THROW(DtypeError, "unknown dtype name '", name,
               "'; expected one of bool, uint8, int32, int64, float16, bfloat16, float32, float64");
}

}  // namespace kusari
