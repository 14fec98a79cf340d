#include "kusari/links/embed_id.h"

#include "kusari/functions/connection.h"

namespace kusari::links {

EmbedID::EmbedID(int64_t in_size, int64_t out_size, std::shared_ptr<Initializer> initialW,
                 std::optional<int64_t> ignore_label_)
    : ignore_label(ignore_label_), in_size_(in_size) {
  KUSARI_CHECK(in_size > 0, ValueError, "EmbedID: in_size must be positive, got ", in_size);
  KUSARI_CHECK(out_size > 0, ValueError, "EmbedID: out_size must be positive, got ", out_size);
  if (!initialW) initialW = std::make_shared<initializers::Normal>(1.0);
  W = add_param("W", Parameter(initialW, Shape{in_size, out_size}, device()));
}

Variable EmbedID::forward(const Variable& x) {
  KUSARI_CHECK(x.defined(), ValueError, "EmbedID: the input is undefined");
  KUSARI_CHECK(x.dtype() == int32 || x.dtype() == int64, DtypeError,
               "EmbedID: expected integer ids (int32 or int64), got ", dtype_name(x.dtype()),
               " of shape ", x.shape());
  return functions::embed_id(x.data(), W, ignore_label, valid_ids_);
}

EmbedID& EmbedID::set_valid_ids(std::optional<int64_t> n) {
  KUSARI_CHECK(!n || (*n > 0 && *n <= in_size_), ValueError,
               "EmbedID: valid_ids must satisfy 0 < valid_ids <= in_size (", in_size_, "), got ",
               n.value_or(0));
  valid_ids_ = n;
  return *this;
}

}  // namespace kusari::links
