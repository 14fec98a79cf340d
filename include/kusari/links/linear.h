// Fully connected layer (Chainer's L.Linear).
#pragma once

#include <optional>

#include "kusari/links/initializers.h"
#include "kusari/links/link.h"

namespace kusari::links {

/// y = x W^T + b with W of shape (out_size, in_size). The input size may be left unknown: W is
/// then sized at the first forward from the input's features.
class Linear : public Link {
 public:
  /// in_size std::nullopt means "infer from the first input". initialW defaults to LeCunNormal,
  /// initial_bias to zeros.
  Linear(std::optional<int64_t> in_size, int64_t out_size, bool nobias = false,
         std::shared_ptr<Initializer> initialW = nullptr, std::shared_ptr<Initializer> initial_bias = nullptr);
  /// A layer of `out_size` outputs whose input size is inferred.
  explicit Linear(int64_t out_size) : Linear(std::nullopt, out_size) {}

  Variable forward(const Variable& x) override;
  /// With the first `n_batch_axes` axes of x kept (Chainer's n_batch_axes): x of shape
  /// (B, T, in) and n_batch_axes 2 give (B, T, out), as a transformer applies its layers.
  Variable forward(const Variable& x, int n_batch_axes);

  Parameter W;
  Parameter b;  // undefined when nobias
  int64_t out_size() const { return out_size_; }

 protected:
  const char* type_name() const override { return "Linear"; }

 private:
  int64_t out_size_;
};

}  // namespace kusari::links
