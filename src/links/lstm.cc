#include "kusari/links/lstm.h"

#include <vector>

#include "kusari/functions/array.h"
#include "kusari/functions/lstm.h"
#include "kusari/functions/math.h"

namespace kusari::links {

LSTM::LSTM(std::optional<int64_t> in_size, int64_t out_size,
           std::shared_ptr<Initializer> lateral_init, std::shared_ptr<Initializer> upward_init,
           std::shared_ptr<Initializer> bias_init, std::shared_ptr<Initializer> forget_bias_init)
    : state_size_(out_size),
      lateral_init_(std::move(lateral_init)),
      upward_init_(std::move(upward_init)),
      bias_init_(std::move(bias_init)),
      forget_bias_init_(std::move(forget_bias_init)) {
  KUSARI_CHECK(out_size > 0, ValueError, "LSTM: out_size must be positive, got ", out_size);
  KUSARI_CHECK(!in_size || *in_size > 0, ValueError, "LSTM: in_size must be positive, got ",
               in_size.value_or(0));
  if (!lateral_init_) lateral_init_ = std::make_shared<initializers::LeCunNormal>();
  if (!upward_init_) upward_init_ = std::make_shared<initializers::LeCunNormal>();
  if (!bias_init_) bias_init_ = std::make_shared<initializers::Zero>();
  if (!forget_bias_init_) forget_bias_init_ = std::make_shared<initializers::One>();
  // Chainer builds both with initialW=0 and fills them in initialize_params.
  upward = add_link("upward", std::make_shared<Linear>(in_size, 4 * out_size, false,
                                                       std::make_shared<initializers::Zero>()));
  lateral = add_link("lateral", std::make_shared<Linear>(out_size, 4 * out_size, true,
                                                         std::make_shared<initializers::Zero>()));
  if (in_size) initialize_params();
}

void LSTM::initialize_params() {
  const int64_t s = state_size_;
  Array lateral_w = lateral->W.data(), upward_w = upward->W.data();
  for (int64_t k = 0; k < 4; ++k) {
    Array lateral_block = lateral_w.at({Slice(k * s, (k + 1) * s)});
    (*lateral_init_)(lateral_block);
    Array upward_block = upward_w.at({Slice(k * s, (k + 1) * s)});
    (*upward_init_)(upward_block);
  }
  // The bias seen as (units, gates): column 2 is the forget gate (Note [LSTM gate layout]).
  Array gates = upward->b.data().reshape({s, 4});
  for (int64_t k = 0; k < 4; ++k) {
    Array column = gates.at({Slice(), k});
    (*(k == 2 ? forget_bias_init_ : bias_init_))(column);
  }
}

Variable LSTM::forward(const Variable& x) {
  KUSARI_CHECK(x.defined() && x.ndim() >= 2, ShapeError,
               "LSTM: expected an input of shape (batch, features...), got ",
               x.defined() ? x.shape() : Shape{});
  if (!upward->W.is_initialized()) {
    const Shape& xs = x.shape();
    const int64_t in_size = Shape(xs.begin() + 1, xs.end()).numel();
    KUSARI_CHECK(in_size > 0, ShapeError, "LSTM: cannot infer in_size from an input of shape ", xs);
    upward->W.initialize({4 * state_size_, in_size});
    initialize_params();
  }
  const int64_t batch = x.shape()[0];
  Variable lstm_in = (*upward)(x);
  Variable h_rest;
  if (h_.defined()) {
    const int64_t h_size = h_.shape()[0];
    KUSARI_CHECK(h_size >= batch, ShapeError, "LSTM: the batch size of x (", batch,
                 ") must not exceed that of the previous state h (", h_size,
                 "); sort the sequences by decreasing length, or call reset_state()");
    if (batch == 0) {
      h_rest = h_;
    } else if (h_size > batch) {
      std::vector<Variable> parts = functions::split_axis(h_, std::vector<int64_t>{batch}, 0);
      lstm_in = lstm_in + (*lateral)(parts[0]);
      h_rest = parts[1];
    } else {
      lstm_in = lstm_in + (*lateral)(h_);
    }
  }
  if (!c_.defined())
    c_ = Variable(Array::zeros({batch, state_size_}, lstm_in.dtype(), lstm_in.device()));
  auto [c, y] = functions::lstm(c_, lstm_in);
  c_ = c;
  if (!h_rest.defined()) {
    h_ = y;
  } else if (y.shape()[0] == 0) {
    h_ = h_rest;
  } else {
    h_ = functions::concat({y, h_rest}, 0);
  }
  return y;
}

void LSTM::reset_state() {
  c_ = Variable();
  h_ = Variable();
}

void LSTM::set_state(const Variable& c, const Variable& h) {
  KUSARI_CHECK(c.defined() && h.defined(), ValueError, "LSTM::set_state: c and h must be defined");
  KUSARI_CHECK(c.ndim() == 2 && c.shape()[1] == state_size_ && h.shape() == c.shape(), ShapeError,
               "LSTM::set_state: c and h must both have shape (batch, ", state_size_, "), got ",
               c.shape(), " and ", h.shape());
  c_ = c;
  h_ = h;
}

void LSTM::to_device(Device device) {
  Chain::to_device(device);
  if (c_.defined()) c_ = functions::copy(c_, device);
  if (h_.defined()) h_ = functions::copy(h_, device);
}

}  // namespace kusari::links
