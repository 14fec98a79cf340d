#include "kusari/mn/dataset.h"

#include <algorithm>
#include <numeric>

#include "kusari/core/random.h"
#include "kusari/datasets/convert.h"
#include "kusari/datasets/sub_dataset.h"
#include "kusari/datasets/tuple_dataset.h"
#include "kusari/mn/object.h"

namespace kusari::mn {

std::pair<int64_t, int64_t> scatter_index_of(int64_t n, int rank, int size, bool force_equal_length) {
  KUSARI_CHECK(size > 0 && rank >= 0 && rank < size, ValueError, "scatter_index: rank ", rank, " of ", size,
               " is invalid");
  KUSARI_CHECK(n >= 0, ValueError, "scatter_index: negative dataset size ", n);
  if (force_equal_length) {
    const int64_t k = (n + size - 1) / size;
    const int64_t begin = n * rank / size;
    return {begin, std::min(begin + k, n)};
  }
  const int64_t q = n / size, rem = n % size;
  const int64_t begin = rank * q + std::min<int64_t>(rank, rem);
  return {begin, begin + q + (rank < rem ? 1 : 0)};
}

std::pair<int64_t, int64_t> scatter_index(int64_t n, Communicator& comm, int root, bool force_equal_length) {
  // The root's n decides (the others may not know it).
  ByteWriter w;
  w.put<int64_t>(n);
  Bytes b = comm.bcast_obj(comm.rank() == root ? w.take() : Bytes{}, root);
  const int64_t total = ByteReader(b).get<int64_t>();
  return scatter_index_of(total, comm.rank(), comm.size(), force_equal_length);
}

std::shared_ptr<Dataset> scatter_dataset(std::shared_ptr<Dataset> dataset, Communicator& comm, int root,
                                         bool shuffle, std::optional<uint64_t> seed, bool force_equal_length) {
  const bool is_root = comm.rank() == root;
  KUSARI_CHECK(!is_root || dataset, ValueError, "scatter_dataset: the root rank ", root, " must pass a dataset");
  // The root decides the order and tells everybody, together with which ranks hold the data.
  std::vector<int64_t> order;
  if (is_root) {
    order.resize(static_cast<size_t>(dataset->size()));
    std::iota(order.begin(), order.end(), 0);
    if (shuffle) {
      Generator gen(seed ? *seed : default_generator().next_uint64());
      for (size_t i = order.size(); i > 1; --i) {
        std::swap(order[i - 1], order[gen.next_uint64() % i]);
      }
    }
  }
  ByteWriter w;
  if (is_root) w.put_vector(order);
  Bytes ob = comm.bcast_obj(w.take(), root);
  ByteReader r(ob);
  order = r.get_vector<int64_t>();
  const int64_t n = static_cast<int64_t>(order.size());

  // Which ranks have a dataset of their own?
  ByteWriter hw;
  hw.put<int32_t>(dataset ? 1 : 0);
  if (dataset) hw.put<int64_t>(dataset->size());
  std::vector<Bytes> holds = comm.allgather_obj(hw.take());
  std::vector<bool> has(static_cast<size_t>(comm.size()));
  for (int k = 0; k < comm.size(); ++k) {
    ByteReader hr(holds[static_cast<size_t>(k)]);
    has[static_cast<size_t>(k)] = hr.get<int32_t>() != 0;
    if (has[static_cast<size_t>(k)]) {
      const int64_t m = hr.get<int64_t>();
      KUSARI_CHECK(m == n, ValueError, "scatter_dataset: rank ", k, " passed a dataset of ", m,
                   " examples but the root's has ", n, "; every rank must pass the same dataset (or nullptr)");
    }
  }

  auto window = scatter_index_of(n, comm.rank(), comm.size(), force_equal_length);
  if (has[static_cast<size_t>(comm.rank())]) {
    // Local data: a view through the agreed order. The root still serves ranks without data.
    if (is_root) {
      for (int k = 0; k < comm.size(); ++k) {
        if (has[static_cast<size_t>(k)] || k == root) continue;
        auto wk = scatter_index_of(n, k, comm.size(), force_equal_length);
        std::vector<int64_t> idx(order.begin() + wk.first, order.begin() + wk.second);
        std::vector<Array> columns = concat_examples(dataset->get_examples(idx), Device::cpu());
        ByteWriter cw;
        cw.put<uint64_t>(columns.size());
        for (const Array& c : columns) cw.put_array(c);
        comm.send_obj(cw.take(), k, 7100);
      }
    }
    return std::make_shared<SubDataset>(dataset, window.first, window.second, order);
  }
  Bytes cb = comm.recv_obj(root, 7100);
  ByteReader cr(cb);
  const uint64_t ncols = cr.get<uint64_t>();
  std::vector<Array> columns;
  for (uint64_t c = 0; c < ncols; ++c) columns.push_back(cr.get_array());
  return std::make_shared<TupleDataset>(columns);
}

}  // namespace kusari::mn
