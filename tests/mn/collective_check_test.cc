// Multi-process tests of the collectives' signature check (CommunicatorOptions::check_collectives,
// KUSARI_MN_CHECK_COLLECTIVES; Note [Collective signatures]) and of settings that must agree.
#include <gtest/gtest.h>

#include <cstdlib>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/optimizers/adam.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

using testing::ThrowsWith;

std::shared_ptr<Communicator> checked() {
  CommunicatorOptions o;
  o.check_collectives = true;
  o.timeout_seconds = 60;
  return create_communicator("naive", o);
}

TEST(CollectiveCheck, AgreeingCollectivesPass) {
  auto comm = checked();
  comm->barrier();
  EXPECT_EQ(comm->allreduce_obj(int64_t{2}), 2 * comm->size());
  Array x = Array::ones({comm->size() * 2}, float32);
  EXPECT_EQ(comm->reduce_scatter(x).shape(), (Shape{2}));
  EXPECT_EQ(comm->allreduce(x).at({0}).item<float>(), comm->size());
}

TEST(CollectiveCheck, DifferentSizesAreNamedOnEveryRank) {
  auto comm = checked();
  comm->barrier();  // #2 (#1 made the communicator)
  Array x = Array::ones({comm->rank() == 0 ? 3 : 4}, float32);
  EXPECT_TRUE(ThrowsWith<CommunicatorError>(
      [&] { comm->allreduce(x); },
      {"call different collectives", "rank 0 calls #3 allreduce (3 float32)", "rank 1 calls #3 allreduce (4 float32)",
       "last collectives: #3 allreduce", "#2 barrier", "same order"}));
  // The communicator is unusable afterwards, and says so.
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->barrier(); }, {"unusable"}));
}

TEST(CollectiveCheck, DifferentCollectivesAreNamedOnEveryRank) {
  setenv("KUSARI_MN_CHECK_COLLECTIVES", "1", 1);
  auto comm = create_communicator("flat");  // (on by the environment)
  unsetenv("KUSARI_MN_CHECK_COLLECTIVES");
  EXPECT_TRUE(ThrowsWith<CommunicatorError>(
      [&] {
        if (comm->rank() == 0) {
          comm->barrier();
        } else {
          comm->allreduce_obj(1.0);
        }
      },
      {"rank 0 calls #2 barrier", "rank 1 calls #2 allreduce_obj (1 float64)"}));
}

TEST(CollectiveCheck, ABadEnvironmentValueIsAnError) {
  setenv("KUSARI_MN_CHECK_COLLECTIVES", "yes", 1);
  EXPECT_TRUE(ThrowsWith<ValueError>([] { create_communicator("naive"); }, {"KUSARI_MN_CHECK_COLLECTIVES", "yes"}));
  unsetenv("KUSARI_MN_CHECK_COLLECTIVES");
}

TEST(OptimizerSettings, ProcessesWithDifferentShardingAllStop) {
  auto comm = create_communicator("naive");
  auto model = std::make_shared<links::Linear>(3, 2);
  MultiNodeOptimizerOptions o;
  o.zero_stage = comm->rank() == comm->size() - 1 ? 2 : 0;
  auto opt = create_multi_node_optimizer(std::make_shared<optimizers::Adam>(), comm, o);
  opt->setup(model);
  const std::string last = std::to_string(comm->size() - 1);
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        opt->update([&] { return functions::sum((*model)(Variable(Array::ones({1, 3}, float32)))); });
      },
      {"different settings", "rank 0 has zero_stage 0", "rank " + last + " has zero_stage 2"}));
}

}  // namespace
}  // namespace kusari::mn
