// Internal names for the byte codec (see kusari/mn/object.h).
#pragma once

#include "kusari/mn/object.h"

namespace kusari::mn::detail {

class Writer : public ByteWriter {};
class Reader : public ByteReader {
 public:
  using ByteReader::ByteReader;
};

}  // namespace kusari::mn::detail
