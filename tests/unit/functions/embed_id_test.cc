// embed_id: known values (lookup, ignore_label, scatter-add gradient with repeated ids), gradient
// checks (first and second order, int32 and int64 ids, float64 and float32, non-contiguous W),
// the bound valid_ids and error cases.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class EmbedIdTest : public testing::FunctionTest {
 protected:
  template <typename T = int32_t>
  Array ids(const std::vector<T>& v, std::optional<Shape> s = std::nullopt) {
    return Array::from_vector(v, s, device());
  }
  // W (5, 3) with W[i, j] = 10 i + j.
  Array table() {
    return Array::from({0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42}, Shape{5, 3},
                       float64, device());
  }
};

TEST_P(EmbedIdTest, LookupKnownValues) {
  Variable W(table(), true);
  Variable y = F::embed_id(ids({0, 4, 2, 2}, Shape{2, 2}), W);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(ArraysClose(y.data(), Array::from({0, 1, 2, 40, 41, 42, 20, 21, 22, 20, 21, 22},
                                                Shape{2, 2, 3}, float64, device())));
  // int64 ids, a 0-d id.
  EXPECT_TRUE(ArraysClose(F::embed_id(ids<int64_t>({3}, Shape{}), W).data(),
                          Array::from({30, 31, 32}, std::nullopt, float64, device())));
  // Ignored ids give rows of zeros.
  Variable z = F::embed_id(ids({1, -1, 3}), W, -1);
  EXPECT_TRUE(ArraysClose(
      z.data(), Array::from({10, 11, 12, 0, 0, 0, 30, 31, 32}, Shape{3, 3}, float64, device())));
  // An ignore_label that is also a valid id (Chainer allows it) masks that id.
  Variable z2 = F::embed_id(ids({1, 2, 3}), W, 2);
  EXPECT_TRUE(ArraysClose(
      z2.data(), Array::from({10, 11, 12, 0, 0, 0, 30, 31, 32}, Shape{3, 3}, float64, device())));
}

TEST_P(EmbedIdTest, GradientScatterAdds) {
  Variable W(table(), true);
  Variable y = F::embed_id(ids({1, 1, 3, -1}), W, -1);
  Array gy =
      Array::from({1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 100, 100}, Shape{4, 3}, float64, device());
  y.set_grad(gy);
  y.backward();
  // Row 1 receives two rows of gy; row 3 one; the ignored id sends nothing.
  EXPECT_TRUE(ArraysClose(W.grad(), Array::from({0, 0, 0, 5, 7, 9, 0, 0, 0, 7, 8, 9, 0, 0, 0},
                                                Shape{5, 3}, float64, device())));
  // With enable_double_backprop the gradient is itself differentiable (a recorded function).
  W.cleargrad();
  Variable y2 = F::embed_id(ids({1, 1, 3, -1}), W, -1);
  Variable gyv(gy, true);
  std::vector<Variable> gW = grad({y2}, {W}, {gyv}, true);
  ASSERT_NE(gW[0].creator(), nullptr);
  EXPECT_STREQ(gW[0].creator()->name(), "embed_id_grad");
  // d sum(gW * c) / d gy = c[ids] (zero for the ignored id).
  Array c = Array::uniform({5, 3}, -1, 1, float64, device(), &gen_);
  std::vector<Variable> ggy = grad({F::sum(gW[0] * Variable(c))}, {gyv});
  Array expected = kusari::take(c, ids({1, 1, 3, 0}), 0);
  expected = kusari::where(
      Array::from_vector(std::vector<bool>{true, true, true, false}, Shape{4, 1}, device()),
      expected, Scalar(0.0));
  EXPECT_TRUE(ArraysClose(ggy[0].data(), expected, 1e-12));
}

TEST_P(EmbedIdTest, Gradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (bool use_int64 : {false, true}) {
      Array x = ids({0, 2, 2, 4, 1, 0}, Shape{2, 3});
      if (use_int64) x = x.astype(int64);
      auto f = [x](const Variable& w) { return F::embed_id(x, w); };
      check(f, uniform({5, 4}, d));
      check(f, noncontig({5, 4}, d));
      Array xi = ids({0, -1, 2, 4, -1, 0}, Shape{3, 2});
      if (use_int64) xi = xi.astype(int64);
      check([xi](const Variable& w) { return F::embed_id(xi, w, -1); }, uniform({5, 4}, d));
      check([x](const Variable& w) { return F::embed_id(x, w, 2); }, noncontig({5, 4}, d));
    }
    // Non-contiguous ids, a 1-d batch.
    Array xt = ids({0, 1, 2, 3, 4, 0}, Shape{2, 3}).transpose();
    check([xt](const Variable& w) { return F::embed_id(xt, w); }, uniform({5, 2}, d));
    check([](const Variable& w) { return F::embed_id(Array::arange(5, int32, w.device()), w); },
          uniform({5, 3}, d));
  }
}

TEST_P(EmbedIdTest, Errors) {
  testing::DebugModeScope debug;  // ids on a GPU are checked in debug mode only
  Variable W(table());
  for (int64_t bad : {5, -1, 100}) {
    try {
      F::embed_id(ids({0, 1, static_cast<int32_t>(bad), 2}), W);
      FAIL() << "embed_id accepted id " << bad;
    } catch (const IndexError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("embed_id"), std::string::npos) << msg;
      EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
    }
  }
  // -2 is out of range even with ignore_label -1.
  EXPECT_THROW(F::embed_id(ids({0, -2}), W, -1), IndexError);
  EXPECT_THROW(F::embed_id(Array::from({0, 1}, std::nullopt, float32, device()), W), DtypeError);
  EXPECT_THROW(F::embed_id(ids({0, 1}), Variable(uniform({5}, float32))), ShapeError);
  EXPECT_THROW(F::embed_id(ids({0, 1}), Variable(ids({0, 1, 2, 3}, Shape{2, 2}))), DtypeError);
}

// valid_ids bounds the ids below the table's rows (Note [Valid ids of an embedding]): the ids
// below it look up and differentiate as without it; an id between it and the rows is refused, on
// a GPU in debug mode by the host check and otherwise by take's own check of the ids.
TEST_P(EmbedIdTest, ValidIdsBoundTheIds) {
  Variable W(table(), true);
  Array x = ids({0, 2, 1, 2}, Shape{2, 2});
  Variable y = F::embed_id(x, W, std::nullopt, 3);
  EXPECT_TRUE(ArraysClose(y.data(), F::embed_id(x, W).data(), 0, 0));
  EXPECT_TRUE(ArraysClose(F::embed_id(x, W, std::nullopt, 5).data(), y.data(), 0, 0));
  // The gradient is the one without the bound: the rows from 3 on receive zeros.
  Array gy = uniform({2, 2, 3}, float64);
  y.set_grad(gy);
  y.backward();
  Array bounded = W.grad();
  W.cleargrad();
  Variable y0 = F::embed_id(x, W);
  y0.set_grad(gy);
  y0.backward();
  EXPECT_TRUE(ArraysClose(bounded, W.grad(), 0, 0));
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([x](const Variable& w) { return F::embed_id(x, w, std::nullopt, 3); },
          uniform({5, 4}, d));
    Array xi = ids({0, -1, 2, 1, -1, 0}, Shape{3, 2});
    check([xi](const Variable& w) { return F::embed_id(xi, w, -1, 3); }, noncontig({5, 4}, d));
  }
  for (bool debug : {true, false}) {
    SCOPED_TRACE(debug ? "debug mode" : "not in debug mode");
    std::optional<testing::DebugModeScope> scope;
    if (debug) scope.emplace();
    for (int32_t bad : {3, 4}) {
      try {
        F::embed_id(ids({0, 1, bad, 2}), W, std::nullopt, 3);
        FAIL() << "embed_id accepted id " << bad << " with valid_ids 3";
      } catch (const IndexError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("embed_id"), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(
            msg.find(
                "expected 0 <= id < 3 (the embedding's valid ids; W of shape (5, 3) has 5 rows)"),
            std::string::npos)
            << msg;
        if (debug || device().is_cpu()) {
          EXPECT_NE(msg.find("id " + std::to_string(bad) + " (flat position 2"), std::string::npos)
              << msg;
        }
      }
    }
    // With ignore_label the ignored id still passes, and the message names it.
    EXPECT_TRUE(ArraysClose(F::embed_id(ids({-1, 2}), W, -1, 3).data(),
                            Array::from({0, 0, 0, 20, 21, 22}, Shape{2, 3}, float64, device())));
    try {
      F::embed_id(ids({-1, 3}), W, -1, 3);
      FAIL() << "embed_id accepted id 3 with valid_ids 3";
    } catch (const IndexError& e) {
      EXPECT_NE(std::string(e.what()).find("or id == ignore_label (-1)"), std::string::npos)
          << e.what();
    }
  }
  // The bound must lie in (0, rows].
  for (int64_t n : {0, -1, 6}) {
    try {
      F::embed_id(ids({0}), W, std::nullopt, n);
      FAIL() << "embed_id accepted valid_ids " << n;
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("embed_id: valid_ids must satisfy 0 < valid_ids <= 5"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("got " + std::to_string(n)), std::string::npos) << msg;
    }
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(EmbedIdTest);

}  // namespace
}  // namespace kusari
