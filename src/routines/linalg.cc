#include "kusari/core/routines.h"

#include "kernels/linalg.h"
#include "routines/routine_util.h"

namespace kusari {

using routines::check_defined;

// --- linear algebra ------------------------------------------------------------------------------

Array matmul(const Array& a_in, const Array& b_in) {
  check_defined("matmul", a_in);
  check_defined("matmul", b_in);
  check_same_device("matmul", {&a_in, &b_in});
  check_same_dtype("matmul", {&a_in, &b_in});
  KUSARI_CHECK(a_in.ndim() >= 1 && b_in.ndim() >= 1, ShapeError,
               "matmul: operands must have at least one dimension, got shapes ", a_in.shape(), " and ", b_in.shape());
  Array a = a_in.ndim() == 1 ? a_in.reshape({1, a_in.shape()[0]}) : a_in;
  Array b = b_in.ndim() == 1 ? b_in.reshape({b_in.shape()[0], 1}) : b_in;
  const int64_t k = a.shape()[a.ndim() - 1];
  KUSARI_CHECK(k == b.shape()[b.ndim() - 2], ShapeError, "matmul: shapes ", a_in.shape(), " and ", b_in.shape(),
               " are not aligned (", k, " != ", b.shape()[b.ndim() - 2], ")");
  Shape abatch(a.shape().begin(), a.shape().end() - 2);
  Shape bbatch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(abatch, bbatch, "matmul");
  Shape ashape = batch, bshape = batch, oshape = batch;
  ashape.push_back(a.shape()[a.ndim() - 2]);
  ashape.push_back(k);
  bshape.push_back(k);
  bshape.push_back(b.shape()[b.ndim() - 1]);
  oshape.push_back(a.shape()[a.ndim() - 2]);
  oshape.push_back(b.shape()[b.ndim() - 1]);
  Array out = Array::empty(oshape, a.dtype(), a.device());
  if (out.size() > 0) kernels::matmul(a.device(), a.broadcast_to(ashape), b.broadcast_to(bshape), out);
  // Drop the axes that 1-d operands were promoted with.
  if (a_in.ndim() == 1 && b_in.ndim() == 1) return out.reshape({});
  if (a_in.ndim() == 1) return out.squeeze({out.ndim() - 2});
  if (b_in.ndim() == 1) return out.squeeze({out.ndim() - 1});
  return out;
}

}  // namespace kusari
