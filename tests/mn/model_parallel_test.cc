// Multi-process tests of model parallelism: differentiable send/recv with delegate variables,
// pseudo_connect, the differentiable collectives and MultiNodeChainList. Each distributed result is
// compared with the same computation done in one process (every rank can rebuild every rank's
// inputs and pieces: they come from fixed formulas and seeds).
//
// Tests of a model cut in two use ranks 0 and 1; with -n 3, rank 2 sits them out and must not
// hang. Collective tests use every rank.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/optimizers/adam.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using testing::ArraysClose;

// The same values on every rank for the same id.
Array input_of(int id, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Array a = Array::arange(0.0, static_cast<double>(n), 1.0, float32) * 0.25 + (0.5 * id - 1.0);
  return a.reshape(shape);
}

// A different nonlinear loss per rank over some variables.
Variable loss_on(int rank, const std::vector<Variable>& ys) {
  Variable total;
  for (size_t i = 0; i < ys.size(); ++i) {
    Variable term = F::sum(F::square(ys[i]) * static_cast<double>(rank + 1 + i)) + F::sum(ys[i]);
    total = total.defined() ? total + term : term;
  }
  return total;
}

Variable leaf(const Array& a) {
  return Variable(a.copy(), true);
}

// A piece of a model: Linear (+ ReLU).
std::shared_ptr<Sequential> make_piece(int64_t in, int64_t out, bool relu = true) {
  auto s = std::make_shared<Sequential>();
  s->add(std::make_shared<links::Linear>(in, out));
  if (relu) s->add([](const Variable& v) { return F::relu(v); });
  return s;
}

// A piece with the same structure and parameters as `piece`.
std::shared_ptr<Sequential> copy_of(const Sequential& piece, int64_t in, int64_t out,
                                    bool relu = true) {
  auto s = make_piece(in, out, relu);
  s->copyparams(piece);
  return s;
}

void expect_same_grads(const Link& actual, const Link& expected, const std::string& what) {
  auto a = actual.namedparams(), e = expected.namedparams();
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].second.grad().defined()) << what << a[i].first << " has no gradient";
    EXPECT_TRUE(ArraysClose(a[i].second.grad(), e[i].second.grad(), 1e-5, 1e-6))
        << what << a[i].first;
  }
}

void expect_same_params(const Link& actual, const Link& expected, const std::string& what) {
  auto a = actual.namedparams(), e = expected.namedparams();
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(ArraysClose(a[i].second.data(), e[i].second.data(), 1e-5, 1e-6))
        << what << a[i].first;
  }
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// --- send / recv ---------------------------------------------------------------------------------

TEST(SendRecvTest, ValuesAndGradientsCrossTheProcesses) {
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  const Array x0 = Array::from({1, 2, 3});
  if (comm->rank() == 0) {
    Variable x = leaf(x0);
    Variable d = send(x * 2.0, *comm, 1);
    EXPECT_EQ(d.ndim(), 0) << "a delegate variable is a 0-d placeholder";
    ASSERT_NE(d.creator(), nullptr);
    d.backward();  // receives dL/d(2x) = 2 * (2x) from rank 1
    EXPECT_TRUE(ArraysClose(x.grad(), x0 * 8.0));
  } else {
    Variable y = recv(*comm, 0);
    EXPECT_TRUE(ArraysClose(y.data(), x0 * 2.0));
    EXPECT_TRUE(y.device().is_cpu());
    F::sum(F::square(y)).backward();
  }
}

TEST(SendRecvTest, OneBackwardThroughTheDelegateRunsTheEarlierSend) {
  // rank 0: z = recv(send(3x)) ; rank 1 multiplies by w in between. One backward() on rank 0's
  // loss runs both of rank 0's communications.
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  const Array x0 = Array::from({1, 2, 3}), w0 = Array::from({0.5, -1, 2});
  const Array z0 = x0 * 3.0 * w0;
  if (comm->rank() == 0) {
    Variable x = leaf(x0);
    Variable d = send(x * 3.0, *comm, 1, /*tag=*/5);
    Variable z = recv(*comm, 1, d, 5);
    EXPECT_TRUE(ArraysClose(z.data(), z0));
    F::sum(F::square(z)).backward();
    EXPECT_TRUE(ArraysClose(x.grad(), z0 * 2.0 * 3.0 * w0, 1e-5, 1e-6));  // dL/dx = 2z * 3w
  } else {
    Parameter w(w0.copy());
    Variable a = recv(*comm, 0, Variable(), 5);
    send(a * w, *comm, 0, 5).backward();
    EXPECT_TRUE(ArraysClose(w.grad(), z0 * 2.0 * x0 * 3.0, 1e-5, 1e-6));  // dL/dw = 2z * 3x
  }
}

TEST(SendRecvTest, InputsWithoutGradientStillTakePartInBackward) {
  // Rank 0 sends a constant: its send must still receive the gradient rank 1 sends back. If it
  // did not, the next message rank 0 receives from rank 1 would be that stray gradient.
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  const Array marker = Array::full({5}, 7.0);
  if (comm->rank() == 0) {
    send(Variable(Array::ones({2})), *comm, 1).backward();
    EXPECT_TRUE(ArraysClose(comm->recv(1), marker));
  } else {
    F::sum(recv(*comm, 0) * 3.0).backward();
    comm->send(marker, 0);
  }
}

TEST(SendRecvTest, NoBackpropModeRecordsNothing) {
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  NoBackpropMode mode;
  if (comm->rank() == 0) {
    EXPECT_EQ(send(leaf(Array::ones({2})), *comm, 1).creator(), nullptr);
  } else {
    EXPECT_EQ(recv(*comm, 0).creator(), nullptr);
  }
}

TEST(SendRecvTest, SendingToOneselfIsAnError) {
  auto comm = create_communicator("naive");
  const int me = comm->rank();
  std::string e = error_of([&] { send(leaf(Array::ones({2})), *comm, me); });
  EXPECT_TRUE(contains(e, "rank " + std::to_string(me))) << e;
  EXPECT_TRUE(contains(e, "itself")) << e;
  EXPECT_THROW(recv(*comm, me), ValueError);
  EXPECT_THROW(send(leaf(Array::ones({2})), *comm, comm->size()), ValueError);
  EXPECT_THROW(recv(*comm, -1), ValueError);
  EXPECT_THROW(send(Variable(), *comm, (me + 1) % comm->size()), ValueError);
}

TEST(SendRecvTest, DoubleBackpropAcrossProcessesIsRefused) {
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  if (comm->rank() == 0) {
    send(leaf(Array::ones({2})), *comm, 1);  // rank 1's backward fails before sending anything back
  } else {
    Variable y = recv(*comm, 0);
    BackwardOptions o;
    o.enable_double_backprop = true;
    EXPECT_THROW(F::sum(y).backward(o), NotImplementedError);
  }
}

// --- pseudo_connect ------------------------------------------------------------------------------

TEST(PseudoConnectTest, PassesValuesAndGradientsAndRunsTheDelegate) {
  Variable a = leaf(Array::from({1, 2}));
  Variable delegate = F::sum(a * 2.0);  // stands for a send's delegate
  Variable x = leaf(Array::from({3, 4, 5}));
  Variable y = pseudo_connect(delegate, x);
  EXPECT_TRUE(ArraysClose(y.data(), x.data()));
  F::sum(F::square(y)).backward();
  EXPECT_TRUE(ArraysClose(x.grad(), Array::from({6, 8, 10})));
  ASSERT_TRUE(a.grad().defined()) << "the delegate's backward did not run";
  EXPECT_TRUE(ArraysClose(a.grad(), Array::zeros({2})));

  auto ys = pseudo_connect(delegate, std::vector<Variable>{x, a});
  ASSERT_EQ(ys.size(), 2u);
  EXPECT_TRUE(ArraysClose(ys[1].data(), a.data()));
  EXPECT_TRUE(pseudo_connect(Variable(), x).is(x)) << "no delegate: the variable itself";
}

// --- collectives ---------------------------------------------------------------------------------

TEST(CollectiveTest, AllgatherMatchesItsDefinitionAndGradient) {
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  auto shape_of = [](int r) { return Shape{r + 1, 2}; };
  Variable x = leaf(input_of(me, shape_of(me)));
  std::vector<Variable> ys = allgather(*comm, x);
  ASSERT_EQ(static_cast<int>(ys.size()), n);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(ArraysClose(ys[i].data(), input_of(i, shape_of(i)))) << i;
  loss_on(me, ys).backward();
  // One process: every rank's loss over copies of every rank's x.
  std::vector<Variable> xs;
  for (int i = 0; i < n; ++i) xs.push_back(leaf(input_of(i, shape_of(i))));
  Variable total;
  for (int r = 0; r < n; ++r) total = total.defined() ? total + loss_on(r, xs) : loss_on(r, xs);
  total.backward();
  EXPECT_TRUE(ArraysClose(x.grad(), xs[me].grad(), 1e-5, 1e-5));
}

TEST(CollectiveTest, AlltoallMatchesItsDefinitionAndGradient) {
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  // Rank r's xs[j] (sent to rank j) has id r * n + j and shape (r + 1, j + 1).
  auto id = [n](int r, int j) { return r * n + j; };
  auto shape = [](int r, int j) { return Shape{r + 1, j + 1}; };
  std::vector<Variable> xs;
  for (int j = 0; j < n; ++j) xs.push_back(leaf(input_of(id(me, j), shape(me, j))));
  std::vector<Variable> ys = alltoall(*comm, xs);
  ASSERT_EQ(static_cast<int>(ys.size()), n);
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(ArraysClose(ys[i].data(), input_of(id(i, me), shape(i, me)))) << i;
  loss_on(me, ys).backward();
  std::vector<std::vector<Variable>> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < n; ++j) all[r].push_back(leaf(input_of(id(r, j), shape(r, j))));
  }
  Variable total;
  for (int r = 0; r < n; ++r) {
    std::vector<Variable> received;
    for (int i = 0; i < n; ++i) received.push_back(all[i][r]);
    total = total.defined() ? total + loss_on(r, received) : loss_on(r, received);
  }
  total.backward();
  for (int j = 0; j < n; ++j)
    EXPECT_TRUE(ArraysClose(xs[j].grad(), all[me][j].grad(), 1e-5, 1e-5)) << j;
  EXPECT_THROW(alltoall(*comm, {xs[0]}), ValueError);
}

TEST(CollectiveTest, BcastMatchesItsDefinitionAndGradient) {
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  for (int root = 0; root < n; ++root) {
    Variable x = me == root ? leaf(input_of(root, {3})) : Variable();
    Variable y = bcast(*comm, x, root);
    EXPECT_TRUE(ArraysClose(y.data(), input_of(root, {3}))) << "root " << root;
    loss_on(me, {y}).backward();
    if (me == root) {
      Variable ref = leaf(input_of(root, {3}));
      Variable total;
      for (int r = 0; r < n; ++r)
        total = total.defined() ? total + loss_on(r, {ref}) : loss_on(r, {ref});
      total.backward();
      EXPECT_TRUE(ArraysClose(x.grad(), ref.grad(), 1e-5, 1e-5)) << "root " << root;
    }
  }
  EXPECT_THROW(bcast(*comm, leaf(Array::ones({1})), n), ValueError);
}

TEST(CollectiveTest, GatherMatchesItsDefinitionAndGradient) {
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  for (int root = 0; root < n; ++root) {
    Variable x = leaf(input_of(me, {me + 2}));
    std::vector<Variable> ys = gather(*comm, x, root);
    if (me == root) {
      ASSERT_EQ(static_cast<int>(ys.size()), n);
      for (int i = 0; i < n; ++i) EXPECT_TRUE(ArraysClose(ys[i].data(), input_of(i, {i + 2})));
      loss_on(root, ys).backward();
    } else {
      ASSERT_EQ(ys.size(), 1u);
      EXPECT_EQ(ys[0].ndim(), 0) << "non-root ranks get a delegate variable";
      ys[0].backward();
    }
    // One process: only the root has a loss.
    std::vector<Variable> refs;
    for (int i = 0; i < n; ++i) refs.push_back(leaf(input_of(i, {i + 2})));
    loss_on(root, refs).backward();
    EXPECT_TRUE(ArraysClose(x.grad(), refs[me].grad(), 1e-5, 1e-5)) << "root " << root;
  }
}

TEST(CollectiveTest, ScatterMatchesItsDefinitionAndGradient) {
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  for (int root = 0; root < n; ++root) {
    std::vector<Variable> xs;
    if (me == root) {
      for (int j = 0; j < n; ++j) xs.push_back(leaf(input_of(10 + j, {j + 1, 2})));
    }
    Variable y = scatter(*comm, xs, root);
    EXPECT_TRUE(ArraysClose(y.data(), input_of(10 + me, {me + 1, 2})));
    loss_on(me, {y}).backward();
    if (me == root) {
      Variable total;
      std::vector<Variable> refs;
      for (int r = 0; r < n; ++r) {
        refs.push_back(leaf(input_of(10 + r, {r + 1, 2})));
        total = total.defined() ? total + loss_on(r, {refs[r]}) : loss_on(r, {refs[r]});
      }
      total.backward();
      for (int j = 0; j < n; ++j)
        EXPECT_TRUE(ArraysClose(xs[j].grad(), refs[j].grad(), 1e-5, 1e-5)) << j;
    }
  }
}

TEST(CollectiveTest, RanksWithoutGradientsStillJoinTheBackward) {
  // Only rank 0's input needs a gradient; the others' nodes are recorded all the same, so the
  // backward alltoall of allgather completes everywhere.
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  Variable x = me == 0 ? leaf(Array::ones({2})) : Variable(Array::ones({2}));
  std::vector<Variable> ys = allgather(*comm, x);
  F::sum(ys[0] * static_cast<double>(me + 1)).backward();
  if (me == 0) EXPECT_TRUE(ArraysClose(x.grad(), Array::full({2}, n * (n + 1) / 2.0)));
}

// --- models split over processes
// ------------------------------------------------------------------

TEST(ModelParallelTest, TwoPiecesGiveTheSingleProcessGradients) {
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  manual_seed(7);  // the same pieces on both ranks
  auto a = make_piece(4, 5), b = make_piece(5, 3, false);
  auto ref_a = copy_of(*a, 4, 5), ref_b = copy_of(*b, 5, 3, false);
  const Array x0 = input_of(1, {2, 4});
  const Array t = Array::from_vector(std::vector<int32_t>{2, 0});
  // One process.
  Variable ref_x = leaf(x0);
  Variable ref_loss = F::softmax_cross_entropy(ref_b->forward(ref_a->forward(ref_x)), t);
  ref_loss.backward();
  // Two processes.
  if (comm->rank() == 0) {
    Variable x = leaf(x0);
    send(a->forward(x), *comm, 1).backward();
    expect_same_grads(*a, *ref_a, "rank 0 ");
    EXPECT_TRUE(ArraysClose(x.grad(), ref_x.grad(), 1e-5, 1e-6));
  } else {
    Variable loss = F::softmax_cross_entropy(b->forward(recv(*comm, 0)), t);
    EXPECT_TRUE(ArraysClose(loss.data(), ref_loss.data()));
    loss.backward();
    expect_same_grads(*b, *ref_b, "rank 1 ");
  }
}

TEST(ModelParallelTest, MultiNodeChainListEqualsTheSingleProcessModelWhileTraining) {
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  manual_seed(11);
  auto a = make_piece(4, 6), b = make_piece(6, 3, false);
  auto ref = std::make_shared<Sequential>();
  ref->add(copy_of(*a, 4, 6)).add(copy_of(*b, 6, 3, false));
  auto chain = std::make_shared<MultiNodeChainList>(comm);
  if (comm->rank() == 0) {
    chain->add_link(a, std::nullopt, 1);
  } else {
    chain->add_link(b, 0, std::nullopt);
  }
  EXPECT_EQ(chain->size(), 1u);
  auto opt = std::make_shared<optimizers::Adam>(0.01),
       ref_opt = std::make_shared<optimizers::Adam>(0.01);
  opt->setup(chain);
  ref_opt->setup(ref);
  for (int step = 0; step < 3; ++step) {
    const Array x = input_of(step, {3, 4});
    ref_opt->update([&] { return F::sum(F::square(ref->forward(Variable(x)))); });
    opt->update([&] {
      // Rank 1 ignores its argument (its piece receives from rank 0).
      Variable out = chain->forward(comm->rank() == 0 ? Variable(x) : Variable());
      if (comm->rank() == 0) {
        EXPECT_EQ(out.ndim(), 0) << "rank 0 returns a delegate variable";
        return out;
      }
      return F::sum(F::square(out));
    });
  }
  if (comm->rank() == 0) {
    expect_same_params(*a, ref->operator[](0), "rank 0 ");
  } else {
    expect_same_params(*b, ref->operator[](1), "rank 1 ");
  }
}

TEST(ModelParallelTest, PipelineOverEveryRank) {
  // Rank r holds piece r: 0 -> 1 -> ... -> n-1, which has the loss.
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  manual_seed(3);
  std::vector<std::shared_ptr<Sequential>> pieces, refs;
  for (int r = 0; r < n; ++r) pieces.push_back(make_piece(3, 3, r + 1 < n));
  for (int r = 0; r < n; ++r) refs.push_back(copy_of(*pieces[r], 3, 3, r + 1 < n));
  MultiNodeChainList chain(comm);
  chain.add_link(pieces[me], me == 0 ? std::nullopt : std::optional<int>(me - 1),
                 me + 1 == n ? std::nullopt : std::optional<int>(me + 1));
  chain.validate();
  const Array x0 = input_of(2, {2, 3});
  Variable x = leaf(x0);
  Variable out = chain.forward(x);
  (me + 1 == n ? F::sum(F::square(out)) : out).backward();

  Variable ref_x = leaf(x0), h = ref_x;
  for (int r = 0; r < n; ++r) h = refs[r]->forward(h);
  if (me + 1 == n) EXPECT_TRUE(ArraysClose(out.data(), h.data(), 1e-5, 1e-6));
  F::sum(F::square(h)).backward();
  expect_same_grads(*pieces[me], *refs[me], "rank " + std::to_string(me) + " ");
  if (me == 0) EXPECT_TRUE(ArraysClose(x.grad(), ref_x.grad(), 1e-5, 1e-6));
}

TEST(ModelParallelTest, RoundTripThroughAnotherRank) {
  // rank 0: x -> A -> (rank 1: B) -> C -> y. Rank 0's one backward runs both its communications.
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  manual_seed(5);
  auto a = make_piece(3, 4), b = make_piece(4, 4), c = make_piece(4, 2, false);
  auto ra = copy_of(*a, 3, 4), rb = copy_of(*b, 4, 4), rc = copy_of(*c, 4, 2, false);
  const Array x0 = input_of(0, {2, 3});
  Variable ref_x = leaf(x0);
  F::sum(F::square(rc->forward(rb->forward(ra->forward(ref_x))))).backward();
  MultiNodeChainList chain(comm);
  if (comm->rank() == 0) {
    chain.add_link(a, std::nullopt, 1);
    chain.add_link(c, 1, std::nullopt);
    Variable x = leaf(x0);
    F::sum(F::square(chain.forward(x))).backward();
    expect_same_grads(*a, *ra, "A ");
    expect_same_grads(*c, *rc, "C ");
    EXPECT_TRUE(ArraysClose(x.grad(), ref_x.grad(), 1e-5, 1e-6));
  } else {
    chain.add_link(b, 0, 0);
    chain.forward(Variable()).backward();
    expect_same_grads(*b, *rb, "B ");
  }
}

TEST(ModelParallelTest, OutputInTheMiddleStillRunsTheLaterSends) {
  // rank 0: y = P(x) is its output, then Q(x) goes to rank 1, whose R has a loss of its own.
  // The single-process equivalent is the sum of both losses.
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  manual_seed(9);
  auto p = make_piece(3, 2, false), q = make_piece(3, 4), r = make_piece(4, 2, false);
  auto rp = copy_of(*p, 3, 2, false), rq = copy_of(*q, 3, 4), rr = copy_of(*r, 4, 2, false);
  const Array x0 = input_of(4, {2, 3});
  Variable ref_x = leaf(x0);
  (F::sum(F::square(rp->forward(ref_x))) + F::sum(F::square(rr->forward(rq->forward(ref_x)))))
      .backward();
  MultiNodeChainList chain(comm);
  if (comm->rank() == 0) {
    chain.add_link(p, std::nullopt, std::nullopt);
    chain.add_link(q, std::nullopt, 1);
    Variable x = leaf(x0);
    Variable y = chain.forward(x);
    EXPECT_TRUE(ArraysClose(y.data(), rp->forward(Variable(x0)).data()));
    F::sum(F::square(y)).backward();
    expect_same_grads(*p, *rp, "P ");
    expect_same_grads(*q, *rq, "Q ");
    EXPECT_TRUE(ArraysClose(x.grad(), ref_x.grad(), 1e-5, 1e-6));
  } else {
    chain.add_link(r, 0, std::nullopt);
    F::sum(F::square(chain.forward(Variable()))).backward();
    expect_same_grads(*r, *rr, "R ");
  }
}

TEST(ModelParallelTest, OutputSentToItselfFeedsTheNextPiece) {
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  manual_seed(13);
  auto a = make_piece(3, 4), b = make_piece(4, 4), c = make_piece(4, 2, false);
  auto ra = copy_of(*a, 3, 4), rb = copy_of(*b, 4, 4), rc = copy_of(*c, 4, 2, false);
  const Array x0 = input_of(6, {2, 3});
  Variable ref_x = leaf(x0);
  F::sum(F::square(rc->forward(rb->forward(ra->forward(ref_x))))).backward();
  MultiNodeChainList chain(comm);
  if (comm->rank() == 0) {
    chain.add_link(a, std::nullopt, 0);
    chain.add_link(b, 0, 1);
    Variable x = leaf(x0);
    chain.forward(x).backward();
    expect_same_grads(*a, *ra, "A ");
    expect_same_grads(*b, *rb, "B ");
    EXPECT_TRUE(ArraysClose(x.grad(), ref_x.grad(), 1e-5, 1e-6));
  } else {
    chain.add_link(c, 0, std::nullopt);
    F::sum(F::square(chain.forward(Variable()))).backward();
    expect_same_grads(*c, *rc, "C ");
  }
}

TEST(ModelParallelTest, PiecesFedByTheInputKeepTheChain) {
  // rank 0: A(x) and B(x) both go to rank 1, which returns D(B(x)) for rank 0's E; rank 1's own
  // output is C(A(x)). The second piece fed by x must stay tied to the first send, or that send's
  // backward would never run. Single-process equivalent: sum(C(A(x))^2) + sum(E(D(B(x)))^2).
  auto comm = create_communicator("naive");
  if (comm->rank() >= 2) return;
  manual_seed(17);
  auto a = make_piece(3, 4), b = make_piece(3, 4), c = make_piece(4, 2, false),
       d = make_piece(4, 4), e = make_piece(4, 2, false);
  auto ra = copy_of(*a, 3, 4), rb = copy_of(*b, 3, 4), rc = copy_of(*c, 4, 2, false),
       rd = copy_of(*d, 4, 4), re = copy_of(*e, 4, 2, false);
  const Array x0 = input_of(3, {2, 3});
  Variable ref_x = leaf(x0);
  (F::sum(F::square(rc->forward(ra->forward(ref_x)))) +
   F::sum(F::square(re->forward(rd->forward(rb->forward(ref_x))))))
      .backward();
  MultiNodeChainList chain(comm);
  if (comm->rank() == 0) {
    chain.add_link(a, std::nullopt, 1);
    chain.add_link(b, std::nullopt, 1);
    chain.add_link(e, 1, std::nullopt);
    Variable x = leaf(x0);
    F::sum(F::square(chain.forward(x))).backward();
    expect_same_grads(*a, *ra, "A ");
    expect_same_grads(*b, *rb, "B ");
    expect_same_grads(*e, *re, "E ");
    EXPECT_TRUE(ArraysClose(x.grad(), ref_x.grad(), 1e-5, 1e-6));
  } else {
    chain.add_link(c, 0, std::nullopt);
    chain.add_link(d, 0, 0);
    F::sum(F::square(chain.forward(Variable()))).backward();
    expect_same_grads(*c, *rc, "C ");
    expect_same_grads(*d, *rd, "D ");
  }
}

// --- configuration errors ------------------------------------------------------------------------

TEST(MultiNodeChainListTest, BadConfigurationsAreReported) {
  auto comm = create_communicator("naive");
  const int me = comm->rank(), n = comm->size();
  EXPECT_THROW(MultiNodeChainList(nullptr), ValueError);
  {
    MultiNodeChainList chain(comm);
    EXPECT_TRUE(contains(error_of([&] {
                           chain.forward(Variable(Array::ones({1, 3})));
                         }),
                         "no pieces"));
    chain.add_link(make_piece(3, 3), std::nullopt, std::nullopt);
    std::string e = error_of([&] { chain.add_link(make_piece(3, 3), std::nullopt, std::nullopt); });
    EXPECT_TRUE(contains(e, "at most one piece")) << e;
    e = error_of([&] { chain.add_link(make_piece(3, 3), n, std::nullopt); });
    EXPECT_TRUE(contains(e, "rank_in = " + std::to_string(n))) << e;
    EXPECT_THROW(chain.add_link(make_piece(3, 3), std::nullopt, -1), ValueError);
    EXPECT_THROW(chain.add_link(std::shared_ptr<Link>(), std::nullopt, 0), ValueError);
    EXPECT_EQ(chain.size(), 1u) << "rejected pieces are not added";
    e = error_of([&] { chain.forward(Variable()); });
    EXPECT_TRUE(contains(e, "undefined")) << e;
  }
  {
    MultiNodeChainList chain(comm);  // receives from itself before anything was sent there
    chain.add_link(make_piece(3, 3), me, std::nullopt);
    EXPECT_TRUE(contains(error_of([&] { chain.forward(Variable()); }), "itself"));
  }
  {
    MultiNodeChainList chain(comm);  // sends to itself, never received
    chain.add_link(make_piece(3, 3), std::nullopt, me);
    EXPECT_TRUE(contains(error_of([&] {
                           chain.forward(Variable(Array::ones({1, 3})));
                         }),
                         "never received"));
  }
}

TEST(MultiNodeChainListTest, ValidateFindsUnmatchedSendsOnEveryRank) {
  auto comm = create_communicator("naive");
  // Rank 0 sends to rank 1, which does not receive: every rank gets the same error.
  MultiNodeChainList chain(comm);
  if (comm->rank() == 0) chain.add_link(make_piece(3, 3), std::nullopt, 1);
  std::string e = error_of([&] { chain.validate(); });
  EXPECT_TRUE(contains(e, "rank 0 sends 1 output(s) to rank 1, but rank 1 receives 0")) << e;
  // Matched, also with rank 2 (if any) holding nothing.
  if (comm->rank() == 1) chain.add_link(make_piece(3, 3), 0, std::nullopt);
  EXPECT_NO_THROW(chain.validate());
}

}  // namespace
}  // namespace kusari::mn
