// Fully connected LSTM layer with state (Chainer's L.LSTM).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kusari/links/initializers.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"

namespace kusari::links {

/// A stateful LSTM layer, Chainer's L.LSTM: each forward(x) computes
///   (c, h) = functions::lstm(c, upward(x) + lateral(h))
/// from the state (c, h) of the previous call, stores the new state and returns h. The first call
/// after construction or reset_state() starts from c = 0 and skips the lateral term.
///
/// Children: upward (Linear in_size -> 4 out_size, with bias) and lateral (Linear out_size ->
/// 4 out_size, no bias), so the npz keys are Chainer's: upward/W, upward/b, lateral/W. Their
/// rows produce the gates in functions::lstm's interleaved order (Note [LSTM gate layout]).
///
/// Initialisation, as Chainer's: both weights are filled block by block (four blocks of out_size
/// rows) by upward_init / lateral_init (LeCunNormal by default); upward/b is bias_init (zeros)
/// except the forget-gate entries upward/b[4 s + 2], which are forget_bias_init (ones). When
/// in_size is unknown, upward/W is sized and all of this happens at the first forward; until
/// then lateral/W is zeros, as in Chainer.
///
/// Batches may shrink from one call to the next (sequences sorted by decreasing length): only the
/// first rows of the state are updated and the others are kept. A larger batch than the state's
/// is an error.
class LSTM : public Chain {
 public:
  /// Chainer's constructor; nullptr initializers take the defaults above.
  LSTM(std::optional<int64_t> in_size, int64_t out_size,
       std::shared_ptr<Initializer> lateral_init = nullptr,
       std::shared_ptr<Initializer> upward_init = nullptr,
       std::shared_ptr<Initializer> bias_init = nullptr,
       std::shared_ptr<Initializer> forget_bias_init = nullptr);
  /// Chainer's one-argument form `LSTM(out_size)`: the input size is inferred.
  explicit LSTM(int64_t out_size) : LSTM(std::nullopt, out_size) {}

  /// One step on x (batch, in_size...): updates the state and returns the new h (batch, out_size).
  Variable forward(const Variable& x) override;
  /// Forgets the state: the next forward starts afresh (Chainer's reset_state).
  void reset_state();
  /// Replaces the state (c and h of shape (batch, out_size)).
  void set_state(const Variable& c, const Variable& h);
  /// The cell state and the last output (undefined before the first step).
  const Variable& c() const { return c_; }
  const Variable& h() const { return h_; }
  /// The number of units (out_size).
  int64_t state_size() const { return state_size_; }
  /// Moves the parameters and the state (through functions::copy, keeping its graph).
  void to_device(Device device) override;

  /// The input-to-gates connection, in_size -> 4 out_size.
  std::shared_ptr<Linear> upward;
  /// The state-to-gates connection, out_size -> 4 out_size, without bias.
  std::shared_ptr<Linear> lateral;

 protected:
  const char* type_name() const override { return "LSTM"; }

 private:
  // Chainer's LSTMBase._initialize_params: fills the weights and the bias once upward/W is sized.
  void initialize_params();

  int64_t state_size_;
  std::shared_ptr<Initializer> lateral_init_, upward_init_, bias_init_, forget_bias_init_;
  Variable c_, h_;
};

}  // namespace kusari::links
