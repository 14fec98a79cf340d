// Internal hooks of the npz serializers shared with their tests. Not part of the public API.
#pragma once

#include <string>

#include "kusari/serializers/npz.h"

namespace kusari::detail {

/// write_npz with the function named in errors, and optionally every ZIP64 record written even
/// when not needed (tests use it to exercise the ZIP64 paths with small files).
void write_npz_impl(const std::string& path, const NamedArrays& arrays, bool compress,
                    const std::string& caller, bool force_zip64 = false);

}  // namespace kusari::detail
