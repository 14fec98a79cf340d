// Multi-node batch normalization equals single-process batch normalization on the concatenated
// batch, in forward, backward and running statistics, also with unequal batch sizes.
#include <gtest/gtest.h>
#include <mpi.h>

#include "kusari/core/build.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using testing::ArraysClose;

TEST(MultiNodeBatchNormalizationTest, EqualsBatchNormalizationOnTheConcatenatedBatch) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  // Rank k holds k + 2 samples of the global batch (unequal sizes on purpose).
  std::vector<int64_t> begin{0};
  for (int k = 0; k < s; ++k) begin.push_back(begin.back() + k + 2);
  const int64_t total = begin.back();
  Generator g(21);
  Array x_all = Array::normal({total, 3, 2, 2}, 0.5, 2.0, float64, Device::cpu(), &g);
  Array w_all = Array::normal({total, 3, 2, 2}, 0, 1, float64, Device::cpu(), &g);
  Array x_mine = x_all.at({Slice(begin[r], begin[r + 1])}).copy();
  Array w_mine = w_all.at({Slice(begin[r], begin[r + 1])}).copy();

  // Reference: one process, the whole batch.
  links::BatchNormalization ref(3, 0.9, 2e-5, float64);
  Variable xr(x_all, true);
  Variable yr = ref(xr);
  F::sum(yr * Variable(w_all)).backward();

  // Multi-node: each rank its part.
  MultiNodeBatchNormalization mn_bn(3, comm, 0.9, 2e-5, float64);
  Variable xm(x_mine, true);
  Variable ym = mn_bn(xm);
  F::sum(ym * Variable(w_mine)).backward();

  EXPECT_TRUE(ArraysClose(ym.data(), yr.data().at({Slice(begin[r], begin[r + 1])}), 1e-10, 1e-10));
  EXPECT_TRUE(ArraysClose(xm.grad(), xr.grad().at({Slice(begin[r], begin[r + 1])}), 1e-9, 1e-10));
  EXPECT_TRUE(ArraysClose(mn_bn.avg_mean(), ref.avg_mean(), 1e-10, 1e-12));
  EXPECT_TRUE(ArraysClose(mn_bn.avg_var(), ref.avg_var(), 1e-10, 1e-12));
  // Parameter gradients are each rank's share; their sum is the single-process gradient.
  EXPECT_TRUE(ArraysClose(comm->allreduce(mn_bn.gamma.grad()), ref.gamma.grad(), 1e-9, 1e-10));
  EXPECT_TRUE(ArraysClose(comm->allreduce(mn_bn.beta.grad()), ref.beta.grad(), 1e-9, 1e-10));
  // Test mode uses the running statistics and communicates nothing.
  TrainMode test(false);
  EXPECT_TRUE(ArraysClose(mn_bn(Variable(x_mine)).data(), ref(Variable(x_mine)).data(), 1e-10, 1e-10));
}

TEST(MultiNodeBatchNormalizationTest, OverNcclOnGpusEqualsTheCpuResult) {
  if (!(build_info().cuda && build_info().nccl)) GTEST_SKIP() << "this build has no CUDA and NCCL";
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (cuda_device_count() < size) GTEST_SKIP() << "needs one GPU per process (" << size << ")";
  auto cpu_comm = create_communicator("naive");
  auto gpu_comm = create_communicator("pure_nccl");
  const int r = gpu_comm->rank();
  const Device dev = Device::cuda(r);
  Generator g(31 + static_cast<uint64_t>(r));
  Array x = Array::normal({4, 3, 2, 2}, 1.0, 2.0, float32, Device::cpu(), &g);
  Array w = Array::normal({4, 3, 2, 2}, 0, 1, float32, Device::cpu(), &g);
  MultiNodeBatchNormalization on_cpu(3, cpu_comm), on_gpu(3, gpu_comm);
  on_gpu.to_device(dev);
  Variable xc(x, true), xg(x.to_device(dev), true);
  Variable yc = on_cpu(xc), yg = on_gpu(xg);
  F::sum(yc * Variable(w)).backward();
  F::sum(yg * Variable(w.to_device(dev))).backward();
  EXPECT_TRUE(ArraysClose(yg.data().to_device(Device::cpu()), yc.data(), 1e-4, 1e-5));
  EXPECT_TRUE(ArraysClose(xg.grad().to_device(Device::cpu()), xc.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(ArraysClose(on_gpu.avg_var().to_device(Device::cpu()), on_cpu.avg_var(), 1e-4, 1e-6));
}

class TwoBn : public Chain {
 public:
  TwoBn() {
    l = add_link("l", std::make_shared<links::Linear>(4, 3));
    bn = add_link("bn", std::make_shared<links::BatchNormalization>(3));
  }
  Variable forward(const Variable& x) override { return (*bn)((*l)(x)); }
  std::shared_ptr<links::Linear> l;
  std::shared_ptr<links::BatchNormalization> bn;
};

TEST(MultiNodeBatchNormalizationTest, CreateMnbnModelConvertsEveryBatchNormalization) {
  auto comm = create_communicator("naive");
  auto model = std::make_shared<TwoBn>();
  EXPECT_EQ(model->bn->statistics_reducer(), nullptr);
  create_mnbn_model(model, comm);
  ASSERT_NE(model->bn->statistics_reducer(), nullptr);
  // The running mean after one step is the global mean of the linear outputs over all ranks.
  comm->bcast_data(*model);
  Generator g(100 + static_cast<uint64_t>(comm->rank()));
  Array x = Array::normal({5, 4}, 0, 1, float32, Device::cpu(), &g);
  (*model)(Variable(x));
  Array h = kusari::mean((*model->l)(Variable(x)).data(), {0});
  Array global_mean = comm->allreduce(h, ReduceOp::kMean);
  EXPECT_TRUE(ArraysClose(model->bn->avg_mean(), global_mean * 0.1, 1e-5, 1e-6));
}

}  // namespace
}  // namespace kusari::mn
