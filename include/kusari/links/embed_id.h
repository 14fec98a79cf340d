// Word embedding layer (Chainer's L.EmbedID).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kusari/links/initializers.h"
#include "kusari/links/link.h"

namespace kusari::links {

/// functions::embed_id with the table W (in_size, out_size): maps integer ids of any shape to
/// rows of W, so the output has shape ids.shape + (out_size,).
class EmbedID : public Link {
 public:
  /// A table of in_size ids by out_size features. initialW nullptr means Normal(1.0), Chainer's
  /// default; ids equal to ignore_label give rows of zeros.
  EmbedID(int64_t in_size, int64_t out_size, std::shared_ptr<Initializer> initialW = nullptr,
          std::optional<int64_t> ignore_label = std::nullopt);

  /// Looks up the ids in x (an int32 or int64 array wrapped in a Variable; not differentiated).
  Variable forward(const Variable& x) override;

  /// Refuses ids >= n (0 < n <= in_size; nullopt: in_size, the default): the rows from n on are
  /// left to no id, such as a padded vocabulary's (functions::embed_id's valid_ids).
  EmbedID& set_valid_ids(std::optional<int64_t> n);
  /// The bound on the ids set by set_valid_ids (nullopt: the table's rows).
  std::optional<int64_t> valid_ids() const { return valid_ids_; }

  /// The embedding table, (in_size, out_size).
  Parameter W;
  /// The id that maps to zeros (none by default).
  std::optional<int64_t> ignore_label;

 protected:
  const char* type_name() const override { return "EmbedID"; }

 private:
  int64_t in_size_;
  std::optional<int64_t> valid_ids_;
};

}  // namespace kusari::links
