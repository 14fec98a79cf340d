#include "kusari/mn/object.h"

namespace kusari::mn {

void ByteWriter::put_array(const Array& a) {
  put<int32_t>(static_cast<int32_t>(a.dtype()));
  put<int32_t>(a.ndim());
  for (int64_t d : a.shape()) put<int64_t>(d);
  Array h = a.to_device(Device::cpu()).contiguous();
  const uint8_t* p = static_cast<const uint8_t*>(h.raw_data());
  buf_.insert(buf_.end(), p, p + h.nbytes());
}

Array ByteReader::get_array() {
  const Dtype dtype = static_cast<Dtype>(get<int32_t>());
  const int nd = get<int32_t>();
  KUSARI_CHECK(nd >= 0 && nd <= kMaxNdim, CommunicatorError, "object decoding: invalid array rank ", nd);
  Shape s;
  for (int i = 0; i < nd; ++i) s.push_back(get<int64_t>());
  Array a = Array::empty(s, dtype, Device::cpu());
  need(static_cast<uint64_t>(a.nbytes()));
  std::memcpy(a.raw_data(), buf_.data() + pos_, static_cast<size_t>(a.nbytes()));
  pos_ += static_cast<uint64_t>(a.nbytes());
  return a;
}

}  // namespace kusari::mn
