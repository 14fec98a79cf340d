// Splitting a dataset over the ranks (ChainerMN's scatter_dataset / scatter_index).
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "kusari/datasets/dataset.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn {

/// The [begin, end) window of the (possibly shuffled) order that rank `rank` of `size` gets
/// from n examples.
///
/// Note [Scatter windows]
/// With force_equal_length (the default) every rank gets k = ceil(n / size) examples: rank i's
/// window starts at floor(n i / size) and is k long, so neighbouring windows overlap by at most
/// one example and the last ends at n; every example is covered and a few repeat, which keeps
/// all ranks in lock-step (same number of iterations per epoch). Without it, the first
/// n mod size ranks get one example more and no example repeats.
std::pair<int64_t, int64_t> scatter_index_of(int64_t n, int rank, int size, bool force_equal_length = true);

/// This rank's window of n examples (every rank must call it with the same n).
std::pair<int64_t, int64_t> scatter_index(int64_t n, Communicator& comm, int root = 0,
                                          bool force_equal_length = true);

/// This rank's part of `dataset`. The root draws the permutation (when shuffling, from `seed`,
/// else from its default generator) and broadcasts it, so every rank agrees on the split.
/// Every rank normally passes the same dataset (loaded from a shared file system); a rank may
/// instead pass nullptr, and the root then sends it its examples (the dataset must then be a
/// TupleDataset on the root).
std::shared_ptr<Dataset> scatter_dataset(std::shared_ptr<Dataset> dataset, Communicator& comm, int root = 0,
                                         bool shuffle = false, std::optional<uint64_t> seed = std::nullopt,
                                         bool force_equal_length = true);

/// scatter_index with the communicator as create_communicator returns it.
inline std::pair<int64_t, int64_t> scatter_index(int64_t n, const std::shared_ptr<Communicator>& comm, int root = 0,
                                                 bool force_equal_length = true) {
  return scatter_index(n, detail::communicator_of(comm, "scatter_index"), root, force_equal_length);
}

/// scatter_dataset with the communicator as create_communicator returns it (ChainerMN's
/// `scatter_dataset(train, comm, shuffle=True)`).
inline std::shared_ptr<Dataset> scatter_dataset(std::shared_ptr<Dataset> dataset,
                                                const std::shared_ptr<Communicator>& comm, int root = 0,
                                                bool shuffle = false, std::optional<uint64_t> seed = std::nullopt,
                                                bool force_equal_length = true) {
  return scatter_dataset(std::move(dataset), detail::communicator_of(comm, "scatter_dataset"), root, shuffle, seed,
                         force_equal_length);
}

}  // namespace kusari::mn
