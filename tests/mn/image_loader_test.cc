// ImageLoader under mpiexec: each rank loads only its shard of the files (scatter_dataset shares
// indices, never pixels), and the shards are disjoint and cover the dataset.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include <unistd.h>

#include "image_test_util.h"
#include "kusari/iterators/image_loader.h"
#include "kusari/mn.h"

namespace kusari::mn {
namespace {

TEST(ImageLoaderShardTest, ShardsAreDisjointAndCoverTheDataset) {
  auto comm = create_communicator("naive");
  const int64_t n = 17;
  // Rank 0 writes the files into a folder named after its process id; all ranks share the host.
  const auto pid =
      comm->allgather(Array::scalar(static_cast<int64_t>(::getpid()), int64, Device::cpu()));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("kusari_image_shard_test_" + std::to_string(pid[0].item<int64_t>()));
  std::vector<std::pair<std::string, int32_t>> pairs;
  for (int64_t i = 0; i < n; ++i)
    pairs.emplace_back("f" + std::to_string(i) + ".jpg", static_cast<int32_t>(i));
  if (comm->rank() == 0) {
    std::filesystem::create_directories(dir);
    for (const auto& [name, label] : pairs) {
      write_jpeg((dir / name).string(), testing::test_picture(20 + label % 3, 24, 3, label));
    }
  }
  comm->barrier();
  for (bool equal : {false, true}) {
    auto full = std::make_shared<LabeledImageDataset>(pairs, dir.string());
    auto shard = scatter_dataset(full, *comm, 0, /*shuffle=*/true, 3, equal);
    ImageLoaderOptions o;
    o.batch_size = 3;
    o.repeat = false;
    o.shuffle = false;
    o.n_workers = 2;
    o.transform = transforms::imagenet_train_transform(8);
    ImageLoader loader(shard, o);
    std::vector<int64_t> mine;
    while (true) {
      const std::vector<Array> b = loader.next_batch();
      if (b.empty()) break;
      EXPECT_EQ(b[0].shape()[1], 3);
      for (int32_t t : b[1].to_vector<int32_t>()) mine.push_back(t);
    }
    ASSERT_EQ(static_cast<int64_t>(mine.size()), shard->size());
    const std::vector<Array> all =
        comm->allgather(Array::from_vector(mine.empty() ? std::vector<int64_t>{-1} : mine));
    std::multiset<int64_t> seen;
    for (const Array& a : all) {
      for (int64_t v : a.to_vector<int64_t>()) {
        if (v >= 0) seen.insert(v);
      }
    }
    // Every file once; with equal lengths, neighbouring shards may share one example at a seam.
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), static_cast<size_t>(n))
        << "equal " << equal;
    if (!equal) EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << "the shards overlap";
  }
  comm->barrier();
  if (comm->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kusari::mn
