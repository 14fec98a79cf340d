#include "kusari/iterators/iterator_state.h"

#include <algorithm>
#include <bit>
#include <string>

#include "kusari/core/error.h"
#include "kusari/datasets/permutation.h"

namespace kusari {
namespace {

std::shared_ptr<const std::vector<int64_t>> draw_order(Generator& generator, int64_t n) {
  return std::make_shared<const std::vector<int64_t>>(random_permutation(n, generator));
}

void append_range(std::vector<int64_t>& out, const IteratorState& s, int64_t begin, int64_t end) {
  for (int64_t k = begin; k < end; ++k) out.push_back(s.order ? (*s.order)[k] : k);
}

}  // namespace

double IteratorState::epoch_detail(int64_t dataset_size) const {
  const int64_t n = epoch_size(dataset_size);
  if (n == 0) return static_cast<double>(epoch);
  return static_cast<double>(epoch) +
         static_cast<double>(current_position) / static_cast<double>(n);
}

IteratorState initial_iterator_state(Generator generator, bool shuffle, int64_t dataset_size) {
  IteratorState s;
  s.generator = generator;
  if (shuffle) s.order = draw_order(s.generator, dataset_size);
  return s;
}

std::optional<std::vector<int64_t>> advance_iterator_state(IteratorState& state, int64_t batch_size,
                                                           bool repeat, int64_t dataset_size,
                                                           const char* fn) {
  if (!repeat && state.epoch > 0) return std::nullopt;
  const int64_t n = state.epoch_size(dataset_size);
  KUSARI_CHECK(!state.order || n == dataset_size, ValueError, fn, ": the order has ", n,
               " entries but the dataset now has ", dataset_size,
               " examples (did the dataset change size?)");
  KUSARI_CHECK(!repeat || n > 0, ValueError, fn,
               ": the dataset is empty; a repeating iterator needs examples");
  // Work on a copy so that `state` is untouched if drawing an order throws.
  IteratorState s = state;
  std::vector<int64_t> indices;
  indices.reserve(static_cast<size_t>(batch_size));
  int64_t i = s.current_position;
  int64_t i_end = repeat ? i + batch_size : std::min(i + batch_size, n);
  s.is_new_epoch = false;
  // An empty non-repeating epoch ends at once (Chainer would loop forever here).
  while (i_end >= n) {
    append_range(indices, s, i, n);
    if (s.order) s.order = draw_order(s.generator, n);
    i = 0;
    i_end = repeat ? i_end - n : 0;
    ++s.epoch;
    s.is_new_epoch = true;
    if (!repeat) break;
  }
  append_range(indices, s, i, i_end);
  s.current_position = i_end;
  state = std::move(s);
  return indices;
}

void serialize_iterator_state(Serializer& ser, IteratorState& state, double& previous_epoch_detail,
                              int64_t batch_size, bool shuffle, int64_t dataset_size,
                              const char* order_key, const char* fn) {
  const bool loading = ser.is_loading();
  IteratorState s = state;
  ser.count("current_position", s.current_position);
  ser.count("epoch", s.epoch);
  ser("is_new_epoch", s.is_new_epoch);
  if (shuffle) {
    Array order;
    std::string key = order_key;
    if (!loading) {
      order = Array::from_vector(*s.order, std::nullopt, Device::cpu());
    } else {
      const std::string other = key == "order" ? "_order" : "order";
      if (!ser.contains(key) && ser.contains(other)) key = other;
      KUSARI_CHECK(
          ser.contains(key), ValueError, fn, "::serialize: the snapshot at '", ser.path(),
          "' has no order ('order' or '_order'); was it saved by an iterator without shuffle?");
    }
    ser(key, order);
    if (loading) {
      KUSARI_CHECK(order.ndim() == 1 && order.shape()[0] == dataset_size, ValueError, fn,
                   "::serialize: the saved order '", ser.path(), key, "' has shape ", order.shape(),
                   " but the dataset has ", dataset_size, " examples");
      std::vector<int64_t> values = order.to_vector<int64_t>();
      std::vector<bool> seen(values.size(), false);
      for (size_t k = 0; k < values.size(); ++k) {
        const int64_t v = values[k];
        KUSARI_CHECK(v >= 0 && v < dataset_size && !seen[static_cast<size_t>(v)], ValueError, fn,
                     "::serialize: the saved order '", ser.path(), key,
                     "' is not a permutation of 0..", dataset_size - 1, " (entry ", k, " is ", v,
                     ")");
        seen[static_cast<size_t>(v)] = true;
      }
      s.order = std::make_shared<const std::vector<int64_t>>(std::move(values));
    }
  }
  const int64_t n = s.epoch_size(dataset_size);
  if (loading) {
    KUSARI_CHECK(s.epoch >= 0 && s.current_position >= 0 && s.current_position <= n, ValueError, fn,
                 "::serialize: the snapshot at '", ser.path(), "' has epoch ", s.epoch,
                 " and current_position ", s.current_position, ", which do not fit an epoch of ", n,
                 " examples");
  }
  double previous = previous_epoch_detail;
  if (!loading || ser.contains("previous_epoch_detail")) {
    ser("previous_epoch_detail", previous);
  } else {
    // Chainer's estimate for snapshots that predate the key.
    previous = n > 0 ? static_cast<double>(s.epoch) +
                           static_cast<double>(s.current_position - batch_size) / n
                     : -1.0;
    previous = s.epoch_detail(dataset_size) > 0 ? std::max(previous, 0.0) : -1.0;
  }
  if (!loading || (ser.contains("generator_seed") && ser.contains("generator_offset"))) {
    auto seed = std::bit_cast<int64_t>(s.generator.seed());
    auto offset = std::bit_cast<int64_t>(s.generator.offset());
    ser("generator_seed", seed);
    ser("generator_offset", offset);
    s.generator.manual_seed(std::bit_cast<uint64_t>(seed));
    s.generator.set_offset(std::bit_cast<uint64_t>(offset));
  }
  if (loading) {
    state = std::move(s);
    previous_epoch_detail = previous;
  }
}

}  // namespace kusari
