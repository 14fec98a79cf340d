// Gradient checks of the array-manipulation functions.
#include <gtest/gtest.h>

#include "kusari/autograd/gradient_check.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;

class ArrayFunctionsTest : public testing::DeviceTest {
 protected:
  Array uniform(const Shape& s) { return Array::uniform(s, -1, 1, float64, device(), &gen_); }
  GradientCheckOptions opts() {
    GradientCheckOptions o;
    o.eps = 1e-5;
    o.atol = 1e-8;
    o.rtol = 1e-6;
    return o;
  }
  void check1(const std::function<Variable(const Variable&)>& f, const Array& x) {
    check_backward(f, x, opts());
    check_double_backward(f, x, opts());
  }
  Generator gen_{99};
};

TEST_P(ArrayFunctionsTest, ShapeFunctions) {
  Array x = uniform({2, 3, 4});
  check1([](const Variable& v) { return F::reshape(v, {6, -1}); }, x);
  check1([](const Variable& v) { return F::transpose(v); }, x);
  check1([](const Variable& v) { return F::transpose(v, {1, 2, 0}); }, x);
  check1([](const Variable& v) { return F::swapaxes(v, 0, 2); }, x);
  check1([](const Variable& v) { return F::broadcast_to(v, {5, 2, 3, 4}); }, x);
  check1([](const Variable& v) { return F::broadcast_to(v, {2, 3, 4}); }, uniform({3, 1}));
  check1([](const Variable& v) { return F::squeeze(v); }, uniform({2, 1, 3}));
  check1([](const Variable& v) { return F::expand_dims(v, 1); }, x);
  check1([](const Variable& v) { return F::flatten(v); }, x.transpose());
  // Through float32 and back: the numerical step must be large against float32 rounding.
  GradientCheckOptions loose;
  loose.eps = 1e-2;
  loose.atol = 1e-4;
  loose.rtol = 1e-4;
  check_backward([](const Variable& v) { return F::cast(F::cast(v, float32), float64) * 2.0; }, x, loose);
}

TEST_P(ArrayFunctionsTest, ConcatStackSplit) {
  VariadicFunction cat = [](const std::vector<Variable>& xs) { return std::vector<Variable>{F::concat(xs, 1)}; };
  check_backward(cat, {uniform({2, 3}), uniform({2, 1}), uniform({2, 2})}, {}, opts());
  check_double_backward(cat, {uniform({2, 3}), uniform({2, 1})}, {}, {}, opts());
  VariadicFunction st = [](const std::vector<Variable>& xs) { return std::vector<Variable>{F::stack(xs, 2)}; };
  check_backward(st, {uniform({2, 3}), uniform({2, 3})}, {}, opts());
  VariadicFunction sp = [](const std::vector<Variable>& xs) { return F::split_axis(xs[0], 3, 1); };
  check_backward(sp, {uniform({2, 6})}, {}, opts());
  VariadicFunction sp2 = [](const std::vector<Variable>& xs) {
    return F::split_axis(xs[0], std::vector<int64_t>{1, 4}, 0);
  };
  check_backward(sp2, {uniform({5, 2})}, {}, opts());
  // Only one output used: the others get zero gradients.
  Variable x(uniform({2, 6}), true);
  F::sum(F::split_axis(x, 2, 1)[1]).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1}));
}

TEST_P(ArrayFunctionsTest, GetItem) {
  Array x = uniform({3, 4, 5});
  check1([](const Variable& v) { return F::get_item(v, {1}); }, x);
  check1([](const Variable& v) { return F::get_item(v, {Slice(0, 2), Slice(), Slice(1, 5, 2)}); }, x);
  check1([](const Variable& v) { return F::get_item(v, {Ellipsis{}, NewAxis{}, -1}); }, x);
  check1([](const Variable& v) { return F::get_item(v, {Slice(std::nullopt, std::nullopt, -1)}); }, x);
}

TEST_P(ArrayFunctionsTest, Where) {
  Array cond = Array::from_vector(std::vector<bool>{true, false, true}, std::nullopt, device());
  VariadicFunction f = [cond](const std::vector<Variable>& xs) {
    return std::vector<Variable>{F::where(cond, xs[0], xs[1])};
  };
  check_backward(f, {uniform({2, 3}), uniform({3})}, {}, opts());
}

KUSARI_INSTANTIATE_DEVICE_TEST(ArrayFunctionsTest);

}  // namespace
}  // namespace kusari
