// Training really learns: an MLP trained by the Trainer on a small part of the real
// Fashion-MNIST reaches an accuracy far above chance on held-out images.
#include <gtest/gtest.h>

#include "kusari/kusari.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;

class SmallMlp : public Chain {
 public:
  SmallMlp() {
    l1 = add_link("l1", std::make_shared<links::Linear>(100));
    l2 = add_link("l2", std::make_shared<links::Linear>(10));
  }
  Variable forward(const Variable& x) override { return (*l2)(F::relu((*l1)(x))); }
  std::shared_ptr<links::Linear> l1, l2;
};

TEST(ConvergenceTest, FashionMnistSubsetLearnsFarAboveChance) {
  auto [train_all, test_all] = get_fashion_mnist();
  auto train = std::make_shared<SubDataset>(train_all, 0, 2000);
  auto test = std::make_shared<SubDataset>(test_all, 0, 500);
  manual_seed(0);
  auto model = std::make_shared<links::Classifier>(std::make_shared<SmallMlp>());
  auto optimizer = std::make_shared<optimizers::Adam>();
  optimizer->setup(model);
  auto updater = std::make_shared<training::StandardUpdater>(std::make_shared<SerialIterator>(train, 50, true, true, 0),
                                                             optimizer);
  training::Trainer trainer(updater, training::interval(3, "epoch"), "");
  auto evaluator = std::make_shared<training::extensions::Evaluator>(
      std::make_shared<SerialIterator>(test, 100, false, false), model);
  trainer.extend(evaluator);
  trainer.run();
  std::map<std::string, double> result = evaluator->evaluate();
  // Chance is 0.1; a few hundred steps on 2000 images reach about 0.75.
  EXPECT_GT(result.at("validation/main/accuracy"), 0.65);
  EXPECT_LT(result.at("validation/main/loss"), 1.0);
}

}  // namespace
}  // namespace kusari
