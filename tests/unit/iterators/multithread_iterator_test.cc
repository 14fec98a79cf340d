#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "iterator_test_util.h"
#include "kusari/iterators/multithread_iterator.h"
#include "kusari/iterators/serial_iterator.h"
#include "map_serializer.h"

namespace kusari {
namespace {

using testing::expect_same_batches;
using testing::ids;
using testing::ids_dataset;
using testing::MapSerializer;
using Ids = std::vector<int64_t>;

/// Example i is {i}; get_example sleeps, counts concurrent calls, and throws for chosen indices.
class ProbeDataset : public Dataset {
 public:
  explicit ProbeDataset(int64_t n, std::chrono::microseconds delay = std::chrono::microseconds(0))
      : n_(n), delay_(delay) {}
  int64_t size() const override { return n_; }
  Example get_example(int64_t i) const override {
    const int now = ++active_;
    int seen = max_active_.load();
    while (now > seen && !max_active_.compare_exchange_weak(seen, now)) {
    }
    ++calls_;
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    --active_;
    if (i == throw_index_)
      throw IndexError("ProbeDataset: example " + std::to_string(i) + " is broken");
    if (i == throw_plain_index_) throw std::runtime_error("plain failure");
    return {Array::scalar(i, int64, Device::cpu())};
  }
  int64_t throw_index_ = -1;
  int64_t throw_plain_index_ = -1;
  mutable std::atomic<int> active_{0};
  mutable std::atomic<int> max_active_{0};
  mutable std::atomic<int64_t> calls_{0};

 private:
  int64_t n_;
  std::chrono::microseconds delay_;
};

TEST(MultithreadIteratorTest, SameBatchesAsSerialIterator) {
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    auto ds = ids_dataset(23);
    SerialIterator serial(ds, 7, true, true, 1234);
    MultithreadIterator multi(ds, 7, true, true, 1234, threads);
    EXPECT_EQ(multi.n_threads(), threads);
    expect_same_batches(serial, multi, 50);
  }
  auto ds = ids_dataset(10);
  SerialIterator serial(ds, 3, false, false);
  MultithreadIterator multi(ds, 3, false, false, std::nullopt, 2);
  expect_same_batches(serial, multi, 6);  // 4 batches, then empty ones
  EXPECT_TRUE(multi.next().empty());
  // A batch of the whole dataset, shuffled: one epoch per batch.
  SerialIterator big_serial(ds, 10, true, true, 8);
  MultithreadIterator big_multi(ds, 10, true, true, 8, 3);
  expect_same_batches(big_serial, big_multi, 5);
}

TEST(MultithreadIteratorTest, DefaultThreadCountAndArguments) {
  MultithreadIterator it(ids_dataset(5), 2);
  EXPECT_GE(it.n_threads(), 1);
  EXPECT_THROW(MultithreadIterator(ids_dataset(5), 2, true, true, std::nullopt, -1), ValueError);
  EXPECT_THROW(MultithreadIterator(nullptr, 2), ValueError);
  EXPECT_THROW(MultithreadIterator(ids_dataset(5), 0), ValueError);
  EXPECT_THROW(MultithreadIterator(ids_dataset(0), 2, true), ValueError);
  // Note [Batch larger than the dataset]
  EXPECT_THROW(MultithreadIterator(ids_dataset(7), 100, true, false, std::nullopt, 1), ValueError);
  EXPECT_THROW(MultithreadIterator(ids_dataset(7), 8, true, true, std::nullopt, 1), ValueError);
  MultithreadIterator once(ids_dataset(7), 100, false, false, std::nullopt, 1);
  EXPECT_EQ(once.next().size(), 7u);
}

TEST(MultithreadIteratorTest, WorkersLoadInParallel) {
  auto ds = std::make_shared<ProbeDataset>(64, std::chrono::microseconds(2000));
  MultithreadIterator it(ds, 16, true, false, std::nullopt, 4);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(it.next().size(), 16u);
  EXPECT_GT(ds->max_active_.load(), 1);
  // After next() returns, the following batch is being prefetched.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (ds->calls_.load() < 5 * 16 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ds->calls_.load(), 5 * 16);
}

TEST(MultithreadIteratorTest, RethrowsAWorkerErrorWithTheIndex) {
  auto ds = std::make_shared<ProbeDataset>(10);
  ds->throw_index_ = 4;
  MultithreadIterator it(ds, 3, true, false, std::nullopt, 2);
  EXPECT_EQ(ids(it.next()), (Ids{0, 1, 2}));
  try {
    it.next();
    FAIL() << "expected IndexError";
  } catch (const IndexError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("get_example(4)"), std::string::npos) << what;
    EXPECT_NE(what.find("example 1 of a batch of 3"), std::string::npos) << what;
    EXPECT_NE(what.find("example 4 is broken"), std::string::npos) << what;
  }
  // The failed batch counts as consumed, as in Chainer; the iterator goes on.
  EXPECT_EQ(ids(it.next()), (Ids{6, 7, 8}));
  EXPECT_EQ(it.epoch(), 0);

  auto plain = std::make_shared<ProbeDataset>(6);
  plain->throw_plain_index_ = 0;
  MultithreadIterator it2(plain, 2, true, false, std::nullopt, 3);
  try {
    it2.next();
    FAIL() << "expected kusari::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plain failure"), std::string::npos) << e.what();
    // The original exception is nested.
    try {
      std::rethrow_if_nested(e);
      FAIL() << "no nested exception";
    } catch (const std::runtime_error& inner) {
      EXPECT_STREQ(inner.what(), "plain failure");
    }
  }
}

TEST(MultithreadIteratorTest, FinalizeMidEpochThenContinue) {
  auto ds = ids_dataset(20);
  SerialIterator serial(ds, 6, true, true, 3);
  MultithreadIterator multi(ds, 6, true, true, 3, 2);
  expect_same_batches(serial, multi, 2);
  multi.finalize();
  multi.finalize();  // idempotent
  expect_same_batches(serial, multi, 6);
}

TEST(MultithreadIteratorTest, DestructionMidEpochDoesNotHang) {
  auto ds = std::make_shared<ProbeDataset>(1000, std::chrono::microseconds(1000));
  const auto t0 = std::chrono::steady_clock::now();
  {
    MultithreadIterator it(ds, 200, true, true, 1, 2);
    EXPECT_EQ(it.next().size(), 200u);  // the next 200 are now being prefetched
  }
  { MultithreadIterator never_used(ds, 200, true, true, 1, 2); }
  {
    MultithreadIterator finalized(ds, 200, true, true, 1, 2);
    finalized.next();
    finalized.finalize();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Loading one batch takes ~0.1 s with 2 threads; shutting down must not wait for a whole batch.
  EXPECT_LT(seconds, 3.0);
  // Once destroyed, no worker touches the dataset any more.
  const int64_t calls = ds->calls_.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ds->calls_.load(), calls);
  EXPECT_EQ(ds->active_.load(), 0);
}

TEST(MultithreadIteratorTest, ResetMatchesSerialReset) {
  auto ds = ids_dataset(11);
  SerialIterator serial(ds, 4, true, true, 21);
  MultithreadIterator multi(ds, 4, true, true, 21, 2);
  expect_same_batches(serial, multi, 5);
  serial.reset();
  multi.reset();
  EXPECT_EQ(multi.epoch(), 0);
  EXPECT_LT(multi.previous_epoch_detail(), 0.0);
  EXPECT_EQ(multi.order(), serial.order());
  expect_same_batches(serial, multi, 8);
}

TEST(MultithreadIteratorTest, SerializeMidEpochAndAcrossIteratorKinds) {
  auto ds = ids_dataset(13);
  MultithreadIterator multi(ds, 5, true, true, 6, 2);
  for (int k = 0; k < 4; ++k) multi.next();
  auto store = std::make_shared<MapSerializer::Store>();
  MapSerializer saver(store, false);
  multi.serialize(saver);
  EXPECT_EQ(store->count("_order"), 1u);  // Chainer's key for MultithreadIterator
  EXPECT_EQ(store->count("current_position"), 1u);
  EXPECT_EQ(store->count("previous_epoch_detail"), 1u);

  MultithreadIterator resumed(ds, 5, true, true, 1000, 3);
  resumed.next();  // a prefetched batch must be dropped on load
  MapSerializer loader(store, true);
  resumed.serialize(loader);
  SerialIterator serial(ds, 5, true, true, 2000);
  MapSerializer loader2(store, true);
  serial.serialize(loader2);
  EXPECT_EQ(serial.order(), multi.order());
  for (int s = 0; s < 20; ++s) {
    Ids expected = ids(multi.next());
    EXPECT_EQ(ids(resumed.next()), expected) << "step " << s;
    EXPECT_EQ(ids(serial.next()), expected) << "step " << s;
    EXPECT_DOUBLE_EQ(resumed.epoch_detail(), multi.epoch_detail());
    EXPECT_DOUBLE_EQ(serial.epoch_detail(), multi.epoch_detail());
  }
}

}  // namespace
}  // namespace kusari
