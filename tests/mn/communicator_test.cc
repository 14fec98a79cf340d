// Multi-process tests of the communicators: topology, every collective against its definition,
// object collectives, chunked transfers, split, and the gradient paths.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>

#include "kusari/core/build.h"
#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "mn/comm/mpi_util.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

using test::world_rank;
using test::world_size;
using testing::ArraysClose;

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string string_of(const Bytes& b) { return std::string(b.begin(), b.end()); }

TEST(CommunicatorTest, TopologyOnOneHost) {
  auto comm = create_communicator("naive");
  EXPECT_EQ(comm->rank(), world_rank());
  EXPECT_EQ(comm->size(), world_size());
  EXPECT_EQ(comm->intra_rank(), comm->rank());
  EXPECT_EQ(comm->intra_size(), comm->size());
  EXPECT_EQ(comm->inter_rank(), 0);
  EXPECT_EQ(comm->inter_size(), 1);
  EXPECT_STREQ(comm->name(), "naive");
}

TEST(CommunicatorTest, PretendHostsOfTwoRanks) {
  setenv("KUSARI_MN_RANKS_PER_HOST", "2", 1);
  auto comm = create_communicator("flat");
  unsetenv("KUSARI_MN_RANKS_PER_HOST");
  const int r = comm->rank(), s = comm->size();
  EXPECT_EQ(comm->intra_rank(), r % 2);
  EXPECT_EQ(comm->inter_rank(), r / 2);
  EXPECT_EQ(comm->inter_size(), (s + 1) / 2);
  EXPECT_EQ(comm->intra_size(), (r / 2 == s / 2 && s % 2 == 1) ? 1 : 2);
}

TEST(CommunicatorTest, UnknownNameListsTheValidOnes) {
  try {
    create_communicator("fastest");
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("naive"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pure_nccl"), std::string::npos) << e.what();
  }
  if (!(build_info().cuda && build_info().nccl)) {
    EXPECT_THROW(create_communicator("pure_nccl"), CommunicatorError);
    EXPECT_THROW(create_communicator("hierarchical"), CommunicatorError);
  }
}

TEST(CommunicatorTest, SendRecv) {
  auto comm = create_communicator("naive");
  Array x = Array::arange(0.0, 6.0, 1.0, float32).reshape({2, 3});
  if (comm->rank() == 0) {
    comm->send(x, 1, 5);
    comm->send(x.transpose(), 1, 6);  // non-contiguous
  } else if (comm->rank() == 1) {
    Array y = comm->recv(0, 5);
    EXPECT_TRUE(array_equal(y, x));
    Array z = comm->recv(0, 6);
    EXPECT_TRUE(array_equal(z, x.transpose()));
  }
  EXPECT_THROW(comm->send(x, comm->rank()), ValueError);
  EXPECT_THROW(comm->recv(comm->rank()), ValueError);
}

TEST(CommunicatorTest, BcastFromEveryRoot) {
  auto comm = create_communicator("naive");
  for (int root = 0; root < comm->size(); ++root) {
    for (Dtype d : {float32, float64, int64, bool_, float16}) {
      Array x = comm->rank() == root ? Array::arange(0.0, 5.0, 1.0, float64).astype(d) : Array();
      Array y = comm->bcast(x, root);
      EXPECT_EQ(y.dtype(), d);
      EXPECT_TRUE(array_equal(y, Array::arange(0.0, 5.0, 1.0, float64).astype(d))) << "root " << root;
    }
  }
}

TEST(CommunicatorTest, GatherAllgatherAlltoallScatter) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  Array mine = Array::full({r + 1}, r, int64);  // different shapes per rank
  for (int root = 0; root < s; ++root) {
    std::vector<Array> g = comm->gather(mine, root);
    if (r == root) {
      ASSERT_EQ(static_cast<int>(g.size()), s);
      for (int k = 0; k < s; ++k) EXPECT_TRUE(array_equal(g[static_cast<size_t>(k)], Array::full({k + 1}, k, int64)));
    } else {
      EXPECT_TRUE(g.empty());
    }
  }
  std::vector<Array> all = comm->allgather(mine);
  ASSERT_EQ(static_cast<int>(all.size()), s);
  for (int k = 0; k < s; ++k) EXPECT_TRUE(array_equal(all[static_cast<size_t>(k)], Array::full({k + 1}, k, int64)));

  std::vector<Array> xs;
  for (int j = 0; j < s; ++j) xs.push_back(Array::full({2}, r * 10 + j, int64));
  std::vector<Array> got = comm->alltoall(xs);
  for (int j = 0; j < s; ++j) EXPECT_TRUE(array_equal(got[static_cast<size_t>(j)], Array::full({2}, j * 10 + r, int64)));
  EXPECT_THROW(comm->alltoall({Array::zeros({1})}), ValueError);

  for (int root = 0; root < s; ++root) {
    std::vector<Array> parts;
    if (r == root) {
      for (int j = 0; j < s; ++j) parts.push_back(Array::full({3}, 100 * root + j, float32));
    }
    Array part = comm->scatter(parts, root);
    EXPECT_TRUE(array_equal(part, Array::full({3}, 100 * root + r, float32)));
  }
}

TEST(CommunicatorTest, AllreduceOps) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  Array x = Array::from({1, 2, 3}, std::nullopt, float64) * static_cast<double>(r + 1);
  const double tri = s * (s + 1) / 2.0;
  EXPECT_TRUE(ArraysClose(comm->allreduce(x, ReduceOp::kSum), Array::from({1, 2, 3}, std::nullopt, float64) * tri));
  EXPECT_TRUE(ArraysClose(comm->allreduce(x, ReduceOp::kMean),
                          Array::from({1, 2, 3}, std::nullopt, float64) * (tri / s)));
  EXPECT_TRUE(ArraysClose(comm->allreduce(x, ReduceOp::kMax), Array::from({1, 2, 3}, std::nullopt, float64) * s));
  EXPECT_TRUE(ArraysClose(comm->allreduce(x, ReduceOp::kMin), Array::from({1, 2, 3}, std::nullopt, float64)));
  for (Dtype d : {float16, bfloat16, float32, int32, int64}) {
    Array y = comm->allreduce(Array::full({4}, r + 1, d), ReduceOp::kSum);
    EXPECT_EQ(y.dtype(), d);
    EXPECT_TRUE(ArraysClose(y.astype(float64), Array::full({4}, tri, float64))) << dtype_name(d);
  }
}

TEST(CommunicatorTest, ObjectCollectives) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  for (int root = 0; root < s; ++root) {
    Bytes b = comm->bcast_obj(r == root ? bytes_of("hello from " + std::to_string(root)) : Bytes{}, root);
    EXPECT_EQ(string_of(b), "hello from " + std::to_string(root));
  }
  std::vector<Bytes> g = comm->gather_obj(bytes_of(std::string(static_cast<size_t>(r), 'x')), 0);
  if (r == 0) {
    for (int k = 0; k < s; ++k) EXPECT_EQ(string_of(g[static_cast<size_t>(k)]), std::string(static_cast<size_t>(k), 'x'));
  }
  std::vector<Bytes> ag = comm->allgather_obj(bytes_of(std::to_string(r)));
  for (int k = 0; k < s; ++k) EXPECT_EQ(string_of(ag[static_cast<size_t>(k)]), std::to_string(k));
  EXPECT_DOUBLE_EQ(comm->allreduce_obj(0.5 * r), 0.5 * s * (s - 1) / 2);
  EXPECT_EQ(comm->allreduce_obj(int64_t{r}, ReduceOp::kMax), s - 1);
  std::vector<double> v = comm->allreduce_obj(std::vector<double>{1.0, static_cast<double>(r)}, ReduceOp::kMean);
  EXPECT_DOUBLE_EQ(v[0], 1.0);
  EXPECT_DOUBLE_EQ(v[1], (s - 1) / 2.0);
  if (r == 0) comm->send_obj(bytes_of("obj"), 1, 3);
  if (r == 1) EXPECT_EQ(string_of(comm->recv_obj(0, 3)), "obj");
  // Typed encoding.
  ByteWriter w;
  w.put<int32_t>(7);
  w.put_string("abc");
  w.put_array(Array::arange(0.0, 3.0, 1.0, float32));
  Bytes enc = comm->bcast_obj(r == 0 ? w.take() : Bytes{}, 0);
  ByteReader rd(enc);
  EXPECT_EQ(rd.get<int32_t>(), 7);
  EXPECT_EQ(rd.get_string(), "abc");
  EXPECT_TRUE(array_equal(rd.get_array(), Array::arange(0.0, 3.0, 1.0, float32)));
  EXPECT_TRUE(rd.done());
  EXPECT_THROW(rd.get<int64_t>(), CommunicatorError);
}

TEST(CommunicatorTest, LargeMessagesGoInChunks) {
  setenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS", "7", 1);
  auto comm = create_communicator("flat");
  const int r = comm->rank(), s = comm->size();
  Array big = Array::arange(0.0, 1000.0, 1.0, float32);
  Array b = comm->bcast(r == 0 ? big : Array(), 0);
  EXPECT_TRUE(array_equal(b, big));
  Array sum = comm->allreduce(big, ReduceOp::kSum);
  EXPECT_TRUE(ArraysClose(sum, big * static_cast<double>(s)));
  Bytes obj(12345, static_cast<uint8_t>(r == 0 ? 9 : 0));
  Bytes got = comm->bcast_obj(obj, 0);
  EXPECT_EQ(got, Bytes(12345, 9));
  unsetenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS");
}

// Note [Allreduce algorithm]: nearly equal pieces, and Open MPI's non-blocking allreduce set to
// reduce-scatter + allgather once a communicator exists (unless the environment chose).
TEST(CommunicatorTest, AllreducePiecesAreNearlyEqual) {
  setenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS", "7", 1);
  EXPECT_EQ(detail::allreduce_piece_elements(1), 1);
  EXPECT_EQ(detail::allreduce_piece_elements(7), 7);
  EXPECT_EQ(detail::allreduce_piece_elements(8), 4);    // 4 + 4, not 7 + 1
  EXPECT_EQ(detail::allreduce_piece_elements(15), 5);   // 5 + 5 + 5
  EXPECT_EQ(detail::allreduce_piece_elements(22), 6);   // 6 + 6 + 6 + 4
  unsetenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS");
  EXPECT_EQ(detail::allreduce_piece_elements(int64_t{3} << 30), int64_t{1} << 30);
}

TEST(CommunicatorTest, OpenMpiReducesWithReduceScatterAndAllgather) {
  auto comm = create_communicator("flat");
  int level = MPI_THREAD_SINGLE, provided = 0;
  MPI_Query_thread(&level);
  ASSERT_EQ(MPI_T_init_thread(level, &provided), MPI_SUCCESS);
  int index = -1;
  const bool open_mpi = MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS;
  int value = -1;
  if (open_mpi) {
    MPI_T_cvar_handle handle;
    int count = 0;
    ASSERT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS);
    ASSERT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS);
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
#ifdef OPEN_MPI
  ASSERT_TRUE(open_mpi) << "Open MPI without libnbc's iallreduce algorithm variable";
  if (std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm") == nullptr) EXPECT_EQ(value, 3);
#endif
  // Whatever the algorithm, every rank gets the same sums, bit for bit.
  manual_seed(11 + static_cast<uint64_t>(comm->rank()));
  const Array mine = Array::normal({1003}, 0.0, 1.0, float32);
  const Array sum = comm->allreduce(mine, ReduceOp::kSum);
  const Array first = comm->bcast(sum, 0);
  EXPECT_TRUE(array_equal(sum, first));
}

TEST(CommunicatorTest, SplitMakesSubgroups) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  auto sub = comm->split(r % 2, r);
  EXPECT_STREQ(sub->name(), "naive");
  EXPECT_EQ(sub->size(), (s + 1 - r % 2) / 2);
  EXPECT_EQ(sub->rank(), r / 2);
  Array total = sub->allreduce(Array::full({}, r, int64));
  int64_t expected = 0;
  for (int k = r % 2; k < s; k += 2) expected += k;
  EXPECT_EQ(total.item<int64_t>(), expected);
}


}  // namespace
}  // namespace kusari::mn
