#include "kusari/datasets/sub_dataset.h"

#include "kusari/core/error.h"
#include "kusari/core/random.h"
#include "kusari/datasets/permutation.h"

namespace kusari {

SubDataset::SubDataset(std::shared_ptr<Dataset> dataset, int64_t start, int64_t finish,
                       std::vector<int64_t> order)
    : dataset_(std::move(dataset)), start_(start), finish_(finish) {
  KUSARI_CHECK(dataset_, ValueError, "SubDataset: the base dataset is null");
  const int64_t n = dataset_->size();
  KUSARI_CHECK(0 <= start_ && start_ <= finish_ && finish_ <= n, ValueError,
               "SubDataset: the range [", start_, ", ", finish_,
               ") does not fit the base dataset of ", n,
               " examples (need 0 <= start <= finish <= ", n, ")");
  if (!order.empty()) {
    KUSARI_CHECK(static_cast<int64_t>(order.size()) == n, ValueError, "SubDataset: the order has ",
                 order.size(), " entries but the base dataset has ", n,
                 " examples; it needs one entry per example");
    for (size_t k = 0; k < order.size(); ++k) {
      KUSARI_CHECK(order[k] >= 0 && order[k] < n, IndexError, "SubDataset: order[", k,
                   "] = ", order[k], " is out of range for a base dataset of ", n, " examples");
    }
  }
  order_ = std::make_shared<const std::vector<int64_t>>(std::move(order));
}

int64_t SubDataset::base_index(int64_t i) const {
  const int64_t n = size();
  KUSARI_CHECK(i >= -n && i < n, IndexError, "SubDataset::get_example: index ", i,
               " is out of range for a subset of ", n, " examples");
  const int64_t position = i >= 0 ? start_ + i : finish_ + i;
  return order_->empty() ? position : (*order_)[position];
}

Example SubDataset::get_example(int64_t i) const {
  return dataset_->get_example(base_index(i));
}

std::vector<Example> SubDataset::get_examples(const std::vector<int64_t>& indices) const {
  std::vector<int64_t> base_indices;
  base_indices.reserve(indices.size());
  for (int64_t i : indices) base_indices.push_back(base_index(i));
  return dataset_->get_examples(base_indices);
}

SubDatasetPair split_dataset(std::shared_ptr<Dataset> dataset, int64_t first_size,
                             std::vector<int64_t> order) {
  KUSARI_CHECK(dataset, ValueError, "split_dataset: the dataset is null");
  const int64_t n = dataset->size();
  KUSARI_CHECK(first_size >= 0, ValueError, "split_dataset: first_size must be non-negative, got ",
               first_size);
  KUSARI_CHECK(first_size <= n, ValueError, "split_dataset: first_size ", first_size,
               " exceeds the dataset size ", n);
  auto first = std::make_shared<SubDataset>(dataset, 0, first_size, order);
  auto second = std::make_shared<SubDataset>(std::move(dataset), first_size, n, std::move(order));
  return {std::move(first), std::move(second)};
}

SubDatasetPair split_dataset_random(std::shared_ptr<Dataset> dataset, int64_t first_size,
                                    std::optional<uint64_t> seed) {
  KUSARI_CHECK(dataset, ValueError, "split_dataset_random: the dataset is null");
  Generator gen(seed ? *seed : default_generator().next_uint64());
  std::vector<int64_t> order = random_permutation(dataset->size(), gen);
  return split_dataset(std::move(dataset), first_size, std::move(order));
}

}  // namespace kusari
