#include <gtest/gtest.h>

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/gradient_check.h"
#include "kusari/autograd/mode.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class AutogradTest : public testing::DeviceTest {
 protected:
  Variable leaf(std::initializer_list<double> v, std::optional<Shape> s = std::nullopt, Dtype d = float64) {
    return Variable(Array::from(v, s, d, device()), true);
  }
};

TEST_P(AutogradTest, BackwardOfAScalarChain) {
  Variable x = leaf({2.0});
  Variable y = F::sum(x * x * x + x * 2.0);  // y = x^3 + 2x, dy/dx = 3x^2 + 2
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 14.0);
  EXPECT_DOUBLE_EQ(y.grad().item<double>(), 1.0);
}

TEST_P(AutogradTest, GradientsAccumulateAcrossUsesAndCalls) {
  Variable x = leaf({1, 2, 3});
  Variable y = F::sum(x + x);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 2}));
  // A second backward without cleargrad accumulates (Chainer semantics).
  F::sum(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 3, 3}));
  x.cleargrad();
  EXPECT_FALSE(x.grad().defined());
}

TEST_P(AutogradTest, LeafGradientsNeverAlias) {
  // add passes gy through unchanged to both inputs; the leaves must not share one array.
  Variable a = leaf({1, 2}), b = leaf({3, 4});
  F::sum(a + b).backward();
  EXPECT_FALSE(a.grad().shares_memory_with(b.grad()));
  EXPECT_TRUE(a.grad().is_contiguous());
  // Broadcast gradients (stride 0) are materialised for leaves.
  Variable c = leaf({5});
  F::sum(F::broadcast_to(c, {4})).backward();
  EXPECT_DOUBLE_EQ(c.grad().item<double>(), 4.0);
}

TEST_P(AutogradTest, IntermediateGradsAreFreedUnlessRetained) {
  Variable x = leaf({1, 2});
  Variable h = x * 3.0;
  Variable y = F::sum(h * h);
  y.backward();
  EXPECT_FALSE(h.grad().defined());
  x.cleargrad();
  Variable h2 = x * 3.0;
  Variable y2 = F::sum(h2 * h2);
  y2.backward({.retain_grad = true});
  EXPECT_EQ(h2.grad().to_vector<double>(), (std::vector<double>{6, 12}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{18, 36}));
}

// Note [Freeing the graph during backward]
TEST_P(AutogradTest, FreeingTheGraphGivesTheSameGradients) {
  auto run = [&](bool retain_graph) {
    Variable x = leaf({0.5, -1.0, 2.0}), w = leaf({1.5, 0.25, -0.5});
    Variable h = F::exp(x * w);     // exp keeps its output
    Variable a = h * x + F::sqrt(h);  // x used twice, h used twice
    Variable b = F::sum(a * a) + F::sum(h);
    BackwardOptions options;
    options.retain_graph = retain_graph;
    b.backward(options);
    return std::make_pair(x.grad().to_vector<double>(), w.grad().to_vector<double>());
  };
  const auto kept = run(true), freed = run(false);
  EXPECT_EQ(kept.first, freed.first);
  EXPECT_EQ(kept.second, freed.second);
}

TEST_P(AutogradTest, FreedGraphReleasesSavedArraysAndRefusesASecondBackward) {
  for (bool retain_graph : {true, false}) {
    SCOPED_TRACE(retain_graph ? "retain_graph" : "free the graph");
    Variable x = leaf({1, 2, 3});
    Variable y;
    std::weak_ptr<void> saved;
    {
      Variable h = F::exp(x);  // its output is saved for the backward of exp and of h * h
      saved = h.data().storage();
      y = F::sum(h * h);
    }
    ASSERT_FALSE(saved.expired());  // only the graph holds h now
    BackwardOptions options;
    options.retain_graph = retain_graph;
    y.backward(options);
    EXPECT_EQ(saved.expired(), !retain_graph);
    x.cleargrad();
    if (retain_graph) {
      y.backward();
      EXPECT_TRUE(x.grad().defined());
    } else {
      EXPECT_TRUE(testing::ThrowsWith<GradientError>([&] { y.backward(); },
                                                     {"backward:", "freed by an earlier backward"}));
    }
  }
}

TEST_P(AutogradTest, NonScalarNeedsAGradient) {
  Variable x = leaf({1, 2});
  Variable y = x * 2.0;
  EXPECT_THROW(y.backward(), GradientError);
  y.set_grad(Array::from({1, 10}, std::nullopt, float64, device()));
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 20}));
}

TEST_P(AutogradTest, NoBackpropModeRecordsNothing) {
  Variable x = leaf({1, 2});
  {
    NoBackpropMode mode;
    Variable y = x * 2.0;
    EXPECT_EQ(y.creator(), nullptr);
    EXPECT_FALSE(y.requires_grad());
  }
  Variable y = x * 2.0;
  ASSERT_NE(y.creator(), nullptr);
  EXPECT_STREQ(y.creator()->name(), "mul_scalar");
  // Inputs that do not require grad are not recorded either.
  Variable c(Array::from({1, 2}, std::nullopt, float64, device()));
  EXPECT_EQ((c * 2.0).creator(), nullptr);
}

TEST_P(AutogradTest, DoubleBackprop) {
  Variable x = leaf({3.0});
  Variable y = F::sum(x * x * x);  // dy/dx = 3x^2 = 27, d2y/dx2 = 6x = 18
  y.backward({.enable_double_backprop = true});
  Variable gx = x.grad_var();
  EXPECT_DOUBLE_EQ(gx.data().item<double>(), 27.0);
  ASSERT_NE(gx.creator(), nullptr);
  x.cleargrad();
  F::sum(gx).backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 18.0);
}

TEST_P(AutogradTest, FunctionalGradLeavesGradsAlone) {
  Variable x = leaf({1, 2});
  Variable h = F::exp(x);
  Variable y = F::sum(h * 2.0);
  std::vector<Variable> g = grad({y}, {x, h});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_TRUE(ArraysClose(g[0].data(), kusari::exp(x.data()) * 2.0));
  EXPECT_EQ(g[1].data().to_vector<double>(), (std::vector<double>{2, 2}));
  // Second order through grad(): d/dx sum(d/dx sum(x^3)) = 6x.
  Variable z = F::sum(F::pow(x, 3));
  Variable gz = grad({z}, {x}, {}, true)[0];
  Variable gg = grad({F::sum(gz)}, {x})[0];
  EXPECT_EQ(gg.data().to_vector<double>(), (std::vector<double>{6, 12}));
}

TEST_P(AutogradTest, LossScaleScalesGradientsAndIsRecorded) {
  Variable x = leaf({1, 2});
  F::sum(x * 3.0).backward({.loss_scale = 128.0});
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{384, 384}));
  EXPECT_DOUBLE_EQ(x.impl().loss_scale, 128.0);
}

TEST_P(AutogradTest, UnchainMakesALeaf) {
  Variable x = leaf({1, 2});
  Variable h = x * 2.0;
  h.unchain();
  EXPECT_EQ(h.creator(), nullptr);
  Variable y = F::sum(h * h);
  y.unchain_backward();
  EXPECT_EQ(y.creator(), nullptr);
}

TEST_P(AutogradTest, RetainedOutputSurvivesDroppedHandle) {
  // exp retains its output; dropping every handle to it must not break backward.
  Variable x = leaf({0.5, 1.0});
  Variable y;
  {
    Variable e = F::exp(x);
    y = F::sum(e * 1.0);
  }
  y.backward();
  EXPECT_TRUE(ArraysClose(x.grad(), kusari::exp(x.data())));
}

TEST_P(AutogradTest, DeepGraphTeardownDoesNotOverflowTheStack) {
  Variable x = leaf({1.0});
  Variable h = x;
  for (int i = 0; i < 200000; ++i) h = h + 0.0;
  h = Variable();  // the whole chain is freed here
  SUCCEED();
}

TEST_P(AutogradTest, GradientCheckerCatchesAWrongRule) {
  auto wrong = [](const Variable& x) {
    return record("wrong_square", {x}, kusari::square(x.data()), [](BackwardContext& ctx) {
      ctx.set_input_grad(0, ctx.output_grad() * ctx.input(0) * 3.0);  // should be 2x
    });
  };
  Array x = Array::uniform({3, 2}, -1, 1, float64, device());
  EXPECT_THROW(check_backward(wrong, x), GradientCheckError);
  auto right = [](const Variable& x) { return F::square(x); };
  EXPECT_NO_THROW(check_backward(right, x));
  EXPECT_NO_THROW(check_double_backward(right, x));
}

TEST_P(AutogradTest, WrongGradientShapeIsReported) {
  Variable x = leaf({1, 2, 3});
  Variable y = record("bad_shape", {x}, x.data() * 2.0, [](BackwardContext& ctx) {
    ctx.set_input_grad(0, F::sum(ctx.output_grad()));
  });
  EXPECT_THROW(F::sum(y).backward(), GradientError);
}

// --- Note [Accumulating into an input's gradient] ----------------------------------------------

class AccumulatorTest : public testing::DeviceTest {
 protected:
  Variable leaf(std::initializer_list<double> v) { return Variable(Array::from(v, std::nullopt, float64, device()), true); }

  /// y = 2x, whose rule adds 2 gy into x's gradient when the engine offers it; counts the
  /// offers in `offered`.
  Variable twice(const Variable& x) {
    return record("twice", {x}, x.data() * 2.0, [this](BackwardContext& ctx) {
      Array acc = ctx.input_grad_accumulator(0);
      if (acc.defined()) {
        ++offered;
        add_to(acc, ctx.output_grad().data() * 2.0);
        ctx.set_input_grad_accumulated(0);
      } else {
        ctx.set_input_grad(0, ctx.output_grad() * 2.0);
      }
    });
  }

  /// exp(exp(exp(z))): a variable of a higher generation than anything made from one leaf in a
  /// step, so that functions of it and h run before twice(h) (the engine runs the newest first).
  static Variable deep(const Variable& z) { return F::exp(F::exp(F::exp(z))); }

  int offered = 0;
};

TEST_P(AccumulatorTest, AnUnsharedGradientIsAddedIntoInPlace) {
  Variable x = leaf({0.1, -0.2, 0.3}), z = leaf({0.05, 0.1, -0.1});
  Variable h = x * 3.0;
  Variable w = deep(z);
  // mul(h, w) runs first and gives h a fresh gradient (w); twice(h) then adds 2 into it.
  Variable loss = F::sum(twice(h)) + F::sum(h * w);
  loss.backward();
  EXPECT_EQ(offered, 1);
  EXPECT_TRUE(ArraysClose(x.grad(), (w.data() + 2.0) * 3.0, 1e-12, 1e-12));
  // The same in the functional mode, which keeps gradients in a map.
  offered = 0;
  Variable h2 = x * 3.0;
  Variable loss2 = F::sum(twice(h2)) + F::sum(h2 * w);
  const auto g = grad({loss2}, {x, h2});
  EXPECT_EQ(offered, 1);
  EXPECT_TRUE(ArraysClose(g[0].data(), (w.data() + 2.0) * 3.0, 1e-12, 1e-12));
  EXPECT_TRUE(ArraysClose(g[1].data(), w.data() + 2.0, 1e-12, 1e-12));
}

TEST_P(AccumulatorTest, AGradientSharedWithAnotherVariableIsNotWrittenTo) {
  for (const bool retain_grad : {false, true}) {
    SCOPED_TRACE(retain_grad ? "retain_grad" : "default");
    offered = 0;
    Variable x = leaf({0.1, -0.2, 0.3}), z = leaf({0.05, 0.1, -0.1});
    Variable h = x * 3.0;
    Variable w = deep(z);
    // add gives q's gradient to h and w as the same array. w's creator runs before twice(h):
    // without retain_grad w's gradient is dropped then and h's is h's alone; with it, q and w
    // keep theirs, which twice must not change.
    Variable q = h + w;
    Variable loss = F::sum(twice(h)) + F::sum(F::exp(q));
    loss.backward({.retain_grad = retain_grad});
    EXPECT_EQ(offered, retain_grad ? 0 : 1);
    const Array eq = kusari::exp(q.data());
    EXPECT_TRUE(ArraysClose(x.grad(), (eq + 2.0) * 3.0, 1e-12, 1e-12));
    if (retain_grad) {
      EXPECT_TRUE(ArraysClose(q.grad(), eq, 0, 0));
      EXPECT_TRUE(ArraysClose(w.grad(), eq, 0, 0));
      EXPECT_TRUE(ArraysClose(h.grad(), eq + 2.0, 1e-12, 1e-12));
    }
  }
}

TEST_P(AccumulatorTest, NeverOfferedToLeavesOrWhileRecording) {
  Variable x = leaf({0.1, -0.2, 0.3}), z = leaf({0.05, 0.1, -0.1});
  Variable w = deep(z);
  // x is a leaf: its gradient may be adopted by a persistent buffer, so it is never offered.
  F::sum(F::sum(twice(x)) + F::sum(x * w)).backward();
  EXPECT_EQ(offered, 0);
  EXPECT_TRUE(ArraysClose(x.grad(), w.data() + 2.0, 1e-12, 1e-12));
  // With double backprop the sum is recorded, never written in place.
  x.cleargrad();
  Variable h = x * 3.0;
  (F::sum(twice(h)) + F::sum(h * w)).backward({.enable_double_backprop = true});
  EXPECT_EQ(offered, 0);
  EXPECT_TRUE(ArraysClose(x.grad(), (w.data() + 2.0) * 3.0, 1e-12, 1e-12));
}

KUSARI_INSTANTIATE_DEVICE_TEST(AccumulatorTest);

// --- Note [Gradients in a persistent buffer] ---------------------------------------------------

class GradBufferTest : public testing::DeviceTest {
 protected:
  Parameter param(std::initializer_list<double> v) {
    return Parameter(Array::from(v, std::nullopt, float64, device()));
  }
  /// A flat float64 buffer of `n` elements, all `fill`.
  Array flat(int64_t n, double fill = -1.0) { return Array::full({n}, fill, float64, device()); }
  static std::vector<double> values(const Array& a) { return a.to_vector<double>(); }
};

TEST_P(GradBufferTest, FirstGradientIsAdoptedNotCopied) {
  Parameter p = param({1, 2, 3});
  Array whole = flat(8);
  Array segment = whole.at({Slice(2, 5)});
  p.set_grad_buffer(segment);
  EXPECT_FALSE(p.grad().defined()) << "binding does not touch the gradient";
  F::sum(p * 2.0).backward();
  // One launch per parameter would cost more than the communicator's one batched copy.
  EXPECT_FALSE(p.grad_in_buffer());
  EXPECT_EQ(values(p.grad()), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(values(whole), (std::vector<double>(8, -1.0))) << "the buffer is untouched";
}

TEST_P(GradBufferTest, ParameterUsedTwiceAccumulatesInPlaceAfterZerograd) {
  Parameter p = param({1, 2, 3});
  Parameter q = param({5, 6, 7});  // no buffer: today's behaviour beside it
  Array whole = flat(8);
  Array buffer = whole.at({Slice(2, 5)});
  p.set_grad_buffer(buffer);
  p.zerograd();
  F::sum(p * p + p * 3.0 + q).backward();  // d/dp = 2p + 3
  EXPECT_TRUE(p.grad_in_buffer());
  EXPECT_EQ(p.grad().storage(), whole.storage());
  EXPECT_EQ(values(buffer), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(values(whole), (std::vector<double>{-1, -1, 5, 7, 9, -1, -1, -1})) << "only the segment is written";
  EXPECT_EQ(values(q.grad()), (std::vector<double>{1, 1, 1}));
  EXPECT_FALSE(q.grad().shares_memory_with(buffer));
  // Add passes one gradient to both of its inputs: the buffered leaf adds it into its buffer,
  // the other adopts or copies it, and the two never alias.
  Parameter a = param({1, 2}), b = param({3, 4});
  Array ab = flat(2);
  a.set_grad_buffer(ab);
  a.zerograd();
  F::sum(a + b).backward();
  EXPECT_TRUE(a.grad_in_buffer());
  EXPECT_FALSE(b.grad().shares_memory_with(a.grad()));
  EXPECT_EQ(values(a.grad()), (std::vector<double>{1, 1}));
  // Without zerograd, a parameter used twice sums into a new array, as without a buffer.
  Parameter c = param({1, 2});
  Array cb = flat(2);
  c.set_grad_buffer(cb);
  F::sum(c * c).backward();
  EXPECT_FALSE(c.grad_in_buffer());
  EXPECT_EQ(values(c.grad()), (std::vector<double>{2, 4}));
  EXPECT_EQ(values(cb), (std::vector<double>{-1, -1}));
}

TEST_P(GradBufferTest, SecondBackwardAccumulatesInPlaceAndCleargradLeavesTheBuffer) {
  Parameter p = param({1, 2, 3});
  Array buffer = flat(3);
  p.set_grad_buffer(buffer);
  p.zerograd();
  F::sum(p * 2.0).backward();
  F::sum(p * 3.0).backward();  // no cleargrad: accumulates, in place
  EXPECT_TRUE(p.grad_in_buffer());
  EXPECT_EQ(values(buffer), (std::vector<double>{5, 5, 5}));
  p.cleargrad();
  EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(p.grad_buffer().defined()) << "cleargrad keeps the binding";
  F::sum(p * 4.0).backward();  // a new gradient, adopted; the buffer keeps what it held
  EXPECT_FALSE(p.grad_in_buffer());
  EXPECT_EQ(values(p.grad()), (std::vector<double>{4, 4, 4}));
  EXPECT_EQ(values(buffer), (std::vector<double>{5, 5, 5}));
}

TEST_P(GradBufferTest, ZerogradFillsTheBuffer) {
  Parameter p = param({1, 2, 3});
  Array buffer = flat(3, 7.0);
  p.set_grad_buffer(buffer);
  p.zerograd();
  EXPECT_TRUE(p.grad_in_buffer());
  EXPECT_EQ(values(buffer), (std::vector<double>{0, 0, 0}));
  F::sum(p * 2.0).backward();  // accumulates onto the zeros, in place
  EXPECT_TRUE(p.grad_in_buffer());
  EXPECT_EQ(values(buffer), (std::vector<double>{2, 2, 2}));
}

TEST_P(GradBufferTest, SetGradKeepsTheBinding) {
  Parameter p = param({1, 2, 3});
  Array buffer = flat(3);
  p.set_grad_buffer(buffer);
  Array mine = Array::from({10, 20, 30}, std::nullopt, float64, device());
  p.set_grad(mine);
  EXPECT_FALSE(p.grad_in_buffer());
  EXPECT_TRUE(p.grad_buffer().defined());
  F::sum(p * 2.0).backward();  // sums into a new array, as without a buffer
  EXPECT_FALSE(p.grad_in_buffer());
  EXPECT_EQ(values(p.grad()), (std::vector<double>{12, 22, 32}));
  EXPECT_EQ(values(mine), (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(values(buffer), (std::vector<double>{-1, -1, -1}));
  p.zerograd();
  F::sum(p * 2.0).backward();
  EXPECT_TRUE(p.grad_in_buffer()) << "after zerograd the buffer is the gradient again";
  EXPECT_EQ(values(buffer), (std::vector<double>{2, 2, 2}));
}

TEST_P(GradBufferTest, DoubleBackpropKeepsTheRecordedGradient) {
  Parameter x = param({3.0});
  Array buffer = flat(1);
  x.set_grad_buffer(buffer);
  Variable y = F::sum(x * x * x);  // dy/dx = 3x^2 = 27, d2y/dx2 = 6x = 18
  y.backward({.enable_double_backprop = true});
  Variable gx = x.grad_var();
  ASSERT_NE(gx.creator(), nullptr) << "the recorded gradient must stay a graph";
  EXPECT_FALSE(x.grad_in_buffer());
  EXPECT_DOUBLE_EQ(gx.data().item<double>(), 27.0);
  EXPECT_EQ(values(buffer), (std::vector<double>{-1}));
  x.zerograd();
  F::sum(gx).backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 18.0);
  EXPECT_TRUE(x.grad_in_buffer()) << "a plain backward adds into the buffer again";
  EXPECT_DOUBLE_EQ(gx.data().item<double>(), 27.0) << "the first-order gradient is untouched";
  // The functional grad() never touches a leaf's gradient or buffer.
  std::vector<Variable> g = grad({F::sum(x * 5.0)}, {x});
  EXPECT_DOUBLE_EQ(g[0].data().item<double>(), 5.0);
  EXPECT_EQ(values(buffer), (std::vector<double>{18}));
}

TEST_P(GradBufferTest, BindingChecksTheBuffer) {
  Parameter p = param({1, 2, 3, 4, 5, 6});
  p.set_data(p.data().reshape({2, 3}));
  p.set_name("W");
  try {
    p.set_grad_buffer(Array::zeros({3, 2}, float64, device()));
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("set_grad_buffer"), std::string::npos) << m;
    EXPECT_NE(m.find("'W'"), std::string::npos) << m;
    EXPECT_NE(m.find("(2, 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("(3, 2)"), std::string::npos) << m;
  }
  try {
    p.set_grad_buffer(Array::zeros({2, 3}, float32, device()));
    FAIL() << "expected DtypeError";
  } catch (const DtypeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("float64"), std::string::npos) << m;
    EXPECT_NE(m.find("float32"), std::string::npos) << m;
  }
  if (device().is_cuda()) EXPECT_THROW(p.set_grad_buffer(Array::zeros({2, 3}, float64, Device::cpu())), DeviceError);
  EXPECT_THROW(p.set_grad_buffer(Array::zeros({3, 2}, float64, device()).transpose()), ValueError);
  EXPECT_THROW(p.set_grad_buffer(p.data()), ValueError) << "a buffer overlapping the data";
  Parameter lazy(nullptr);
  EXPECT_THROW(lazy.set_grad_buffer(Array::zeros({2}, float32, device())), ValueError);
  // An undefined array unbinds.
  p.set_grad_buffer(Array::zeros({2, 3}, float64, device()));
  EXPECT_TRUE(p.grad_buffer().defined());
  p.set_grad_buffer(Array());
  EXPECT_FALSE(p.grad_buffer().defined());
}

TEST_P(GradBufferTest, ReshapingOrMovingTheParameterUnbinds) {
  Parameter p = param({1, 2, 3});
  p.set_grad_buffer(flat(3));
  p.set_data(p.data() * 2.0);  // same shape, dtype and device: still bound
  EXPECT_TRUE(p.grad_buffer().defined());
  p.to_device(device());  // where it already is
  EXPECT_TRUE(p.grad_buffer().defined());
  p.set_data(p.data().astype(float32));
  EXPECT_FALSE(p.grad_buffer().defined());
  p.set_grad_buffer(Array::zeros({3}, float32, device()));
  p.initialize({4});
  EXPECT_FALSE(p.grad_buffer().defined());
  if (device().is_cuda()) {  // (a CPU-only machine has nowhere else to go)
    p.set_grad_buffer(Array::zeros({4}, float32, device()));
    p.to_device(Device::cpu());
    EXPECT_FALSE(p.grad_buffer().defined());
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(GradBufferTest);

KUSARI_INSTANTIATE_DEVICE_TEST(AutogradTest);

TEST(ParameterTest, LazyInitialisation) {
  struct Fill : Initializer {
    void operator()(Array& a) const override { a.fill(0.25); }
  };
  Parameter p(std::make_shared<Fill>());
  EXPECT_FALSE(p.is_initialized());
  EXPECT_TRUE(p.requires_grad());
  p.initialize({2, 3});
  EXPECT_TRUE(p.is_initialized());
  EXPECT_EQ(p.data().to_vector<float>(), std::vector<float>(6, 0.25f));
  Parameter q{Parameter(nullptr, Shape{2})};
  EXPECT_TRUE(std::isnan(q.data().to_vector<float>()[0]));
}

}  // namespace
}  // namespace kusari
