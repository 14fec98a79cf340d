// Multi-process tests of check_same_settings: ranks that were started with different settings
// all get the same error naming the setting and each rank's value, instead of hanging.
#include <gtest/gtest.h>

#include <string>

#include "kusari/mn.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

using test::world_rank;
using test::world_size;
using testing::ThrowsWith;

TEST(SameSettingsTest, EqualSettingsPass) {
  auto comm = create_communicator("naive");
  EXPECT_NO_THROW(check_same_settings(*comm, {{"--batchsize", "100"}, {"--epoch", "20"}}, "prog"));
  EXPECT_NO_THROW(check_same_settings(*comm, {}, "prog"));
  // The communicator is still in step: a collective afterwards sees every rank.
  EXPECT_EQ(comm->allreduce_obj(int64_t{1}), world_size());
}

TEST(SameSettingsTest, EveryRankNamesTheDifferingSettingAndTheValues) {
  auto comm = create_communicator("naive");
  // Rank 1 alone has another batch size: rank 0's value and rank 1's are both named, on every rank.
  const std::string batch = world_rank() == 1 ? "50" : "100";
  std::string ranks_with_100 = "rank 0";
  if (world_size() == 3) ranks_with_100 = "ranks 0 and 2";
  const std::string difference =
      "prog: the processes were started with different settings: --batchsize is '100' on " +
      ranks_with_100 + " but '50' on rank 1";
  EXPECT_TRUE(ThrowsWith<CommunicatorError>(
      [&] {
        check_same_settings(*comm, {{"--batchsize", batch}, {"--epoch", "20"}}, "prog");
      },
      {difference,
       "every process must be started with the same --batchsize (the same command line)"}));
  EXPECT_EQ(comm->allreduce_obj(int64_t{1}), world_size());

  // Two settings differ; the unchanged one is not named.
  const std::string epoch = std::to_string(world_rank() + 1);
  EXPECT_TRUE(ThrowsWith<CommunicatorError>(
      [&] {
        check_same_settings(*comm, {{"--batchsize", batch}, {"--unit", "1000"}, {"--epoch", epoch}},
                            "prog");
      },
      {"--batchsize is '100' on ", "; --epoch is '1' on rank 0", "'2' on rank 1",
       "the same --batchsize, --epoch ("}));
  try {
    check_same_settings(*comm, {{"--batchsize", batch}, {"--unit", "1000"}}, "prog");
  } catch (const CommunicatorError& e) {
    EXPECT_EQ(std::string(e.what()).find("--unit is"), std::string::npos) << e.what();
  }
}

TEST(SameSettingsTest, ASettingOnlySomeRanksNameIsNotGivenOnTheOthers) {
  auto comm = create_communicator("naive");
  std::vector<Setting> settings = {{"--batchsize", "100"}};
  if (world_rank() == 0) settings.push_back({"--double-buffering", "on"});
  EXPECT_TRUE(ThrowsWith<CommunicatorError>(
      [&] { check_same_settings(*comm, settings, "prog"); },
      {"--double-buffering is 'on' on rank 0 but (not given) on rank"}));
}

}  // namespace
}  // namespace kusari::mn
