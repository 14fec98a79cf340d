// What the two model-parallel MNIST examples share: their flags, the two halves of the MLP, a test
// set evaluation that runs on both halves at once, and a report printed once per epoch.
// Read train_mnist_model_parallel.cc first; this file only holds the plumbing.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace example {

namespace F = kusari::functions;
using kusari::Variable;

/// The command-line flags (Chainer's train_mnist names and defaults).
struct Args {
  int64_t batchsize = 100;
  int64_t epoch = 20;
  int64_t unit = 1000;
  std::string out = "result";
  bool help = false;
};

inline const char* kUsage =
    "flags:\n"
    "  --batchsize, -b N   examples per minibatch (default 100)\n"
    "  --epoch, -e N       passes over the training set (default 20)\n"
    "  --unit, -u N        units of each hidden layer (default 1000)\n"
    "  --out, -o DIR       output folder (default result)\n"
    "  --help, -h          print this help\n";

/// Parses the flags ("--epoch 5", "--epoch=5" or "-e 5"); throws kusari::ValueError naming a flag
/// that is unknown, lacks its value or has a bad one.
inline Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    const bool has_inline_value = flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos;
    if (has_inline_value) {
      value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
    }
    if (flag == "--help" || flag == "-h") {
      args.help = true;
      continue;
    }
    auto take_value = [&]() {
      if (has_inline_value) return value;
      KUSARI_CHECK(i + 1 < argc, ValueError, "flag ", flag, " needs a value");
      return std::string(argv[++i]);
    };
    auto take_count = [&]() {
      const std::string v = take_value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      KUSARI_CHECK(!v.empty() && *end == '\0' && n > 0, ValueError, "flag ", flag,
                   " needs a positive integer, got '", v, "'");
      return static_cast<int64_t>(n);
    };
    if (flag == "--batchsize" || flag == "-b") {
      args.batchsize = take_count();
    } else if (flag == "--epoch" || flag == "-e") {
      args.epoch = take_count();
    } else if (flag == "--unit" || flag == "-u") {
      args.unit = take_count();
    } else if (flag == "--out" || flag == "-o") {
      args.out = take_value();
    } else {
      KUSARI_THROW(ValueError, "unknown flag '", flag, "'");
    }
  }
  return args;
}

/// The first half of the 784-unit-unit-10 MLP: Linear(784, unit) -> ReLU.
inline std::shared_ptr<kusari::Sequential> first_half(int64_t unit) {
  auto half = std::make_shared<kusari::Sequential>();
  half->add(std::make_shared<kusari::links::Linear>(784, unit)).add([](const Variable& h) {
    return F::relu(h);
  });
  return half;
}

/// The second half: Linear(unit, unit) -> ReLU -> Linear(unit, 10).
inline std::shared_ptr<kusari::Sequential> second_half(int64_t unit) {
  auto half = std::make_shared<kusari::Sequential>();
  half->add(std::make_shared<kusari::links::Linear>(unit, unit))
      .add([](const Variable& h) { return F::relu(h); })
      .add(std::make_shared<kusari::links::Linear>(unit, 10));
  return half;
}

/// Runs the test set through the split model once per epoch. Both ranks of the model-parallel
/// pair run it at the same iteration; the rank with the output (has_output) puts
/// validation/main/loss and validation/main/accuracy into the trainer's observation.
inline std::shared_ptr<kusari::training::Extension> test_evaluator(
    std::shared_ptr<kusari::Dataset> test, int64_t batchsize,
    std::shared_ptr<kusari::mn::MultiNodeChainList> model, bool has_output) {
  auto fn = [=](kusari::training::Trainer& trainer) {
    kusari::NoBackpropMode no_backprop;  // neither rank records a graph, so no backward is owed
    kusari::SerialIterator it(test, batchsize, /*repeat=*/false, /*shuffle=*/false);
    double loss = 0, accuracy = 0;
    int64_t n = 0;
    for (auto batch = it.next(); !batch.empty(); batch = it.next()) {
      std::vector<kusari::Array> xt = kusari::concat_examples(batch);
      Variable y = model->forward(xt[0]);  // the second half ignores x: it receives from the first
      if (has_output) {
        const double b = static_cast<double>(batch.size());
        loss += F::softmax_cross_entropy(y, xt[1]).data().item<double>() * b;
        accuracy += F::accuracy(y, xt[1]).data().item<double>() * b;
      }
      n += static_cast<int64_t>(batch.size());
    }
    if (has_output) {
      trainer.observation()["validation/main/loss"] =
          kusari::Array::scalar(loss / n, kusari::float64);
      trainer.observation()["validation/main/accuracy"] =
          kusari::Array::scalar(accuracy / n, kusari::float64);
    }
  };
  return kusari::training::make_extension(fn, "test_evaluator",
                                          kusari::training::interval(1, "epoch"),
                                          kusari::training::kPriorityWriter);
}

/// Prints one line per epoch: the means of main/loss and main/accuracy over the epoch, the
/// validation values and the elapsed time (what Chainer's LogReport + PrintReport show).
class EpochReport : public kusari::training::Extension {
 public:
  void initialize(kusari::training::Trainer&) override {
    std::printf("%-6s %-12s %-14s %-22s %-26s %s\n", "epoch", "main/loss", "main/accuracy",
                "validation/main/loss", "validation/main/accuracy", "elapsed_time");
  }
  void operator()(kusari::training::Trainer& trainer) override {
    auto& obs = trainer.observation();
    loss_ += obs.at("main/loss").item<double>();
    accuracy_ += obs.at("main/accuracy").item<double>();
    ++count_;
    if (!trainer.updater().is_new_epoch()) return;
    auto value = [&](const char* key) { return obs.count(key) ? obs.at(key).item<double>() : 0.0; };
    std::printf("%-6lld %-12.6f %-14.6f %-22.6f %-26.6f %.2f\n",
                static_cast<long long>(trainer.updater().epoch()), loss_ / count_,
                accuracy_ / count_, value("validation/main/loss"),
                value("validation/main/accuracy"), trainer.elapsed_time());
    std::fflush(stdout);
    loss_ = accuracy_ = 0;
    count_ = 0;
  }
  std::string default_name() const override { return "EpochReport"; }
  std::shared_ptr<kusari::training::Trigger> default_trigger() const override {
    return kusari::training::interval(1, "iteration");
  }

 private:
  double loss_ = 0, accuracy_ = 0;
  int64_t count_ = 0;
};

}  // namespace example
