// Array routines: NumPy-like operations on Arrays, without autograd. Each routine checks its
// arguments (devices, dtypes, shapes), allocates the output and calls the device's kernel (or,
// where a fused kernel declines, a composition of other routines; Note [Kernel families]). They
// are defined by family in src/routines/ (elementwise, reduction, linalg, indexing, nn, update).
// The differentiable versions, on Variables, live in kusari/functions/.
#pragma once

#include <optional>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/op_types.h"

namespace kusari {

// --- elementwise, one operand ------------------------------------------------------------------
/// Applies a unary kernel op; the building block of the named routines below.
Array unary(UnaryOp op, const Array& x, double p0 = 0.0, double p1 = 0.0);
Array negative(const Array& x);
Array abs(const Array& x);
Array sign(const Array& x);
Array exp(const Array& x);
Array log(const Array& x);
Array log1p(const Array& x);
Array expm1(const Array& x);
Array sqrt(const Array& x);
Array rsqrt(const Array& x);
Array square(const Array& x);
Array reciprocal(const Array& x);
Array sin(const Array& x);
Array cos(const Array& x);
Array tanh(const Array& x);
Array sigmoid(const Array& x);
Array relu(const Array& x);
Array floor(const Array& x);
Array ceil(const Array& x);
Array erf(const Array& x);
Array softplus(const Array& x, double beta = 1.0);
Array leaky_relu(const Array& x, double slope);
Array elu(const Array& x, double alpha);
/// x Phi(x) (Phi the standard normal CDF); with tanh_approximation, GPT-2's
/// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
Array gelu(const Array& x, bool tanh_approximation = false);
/// The derivative of gelu at x (the same approximation).
Array gelu_derivative(const Array& x, bool tanh_approximation = false);
/// x sigmoid(x) (also called swish).
Array silu(const Array& x);
/// The derivative of silu at x.
Array silu_derivative(const Array& x);
Array clip(const Array& x, double lo, double hi);
Array power(const Array& x, Scalar exponent);
Array power(Scalar base, const Array& x);
Array isnan(const Array& x);
Array isinf(const Array& x);
Array isfinite(const Array& x);
Array logical_not(const Array& x);

// --- elementwise, two operands (NumPy broadcasting; dtypes must agree) -----------------------------
/// Applies a binary kernel op after broadcasting; `fn` names the caller in errors (the op's name by default).
Array binary(BinaryOp op, const Array& a, const Array& b, const char* fn = nullptr);
Array add(const Array& a, const Array& b);
Array subtract(const Array& a, const Array& b);
Array multiply(const Array& a, const Array& b);
Array divide(const Array& a, const Array& b);
Array power(const Array& a, const Array& b);
Array maximum(const Array& a, const Array& b);
Array minimum(const Array& a, const Array& b);
Array maximum(const Array& a, Scalar b);
Array minimum(const Array& a, Scalar b);
Array equal(const Array& a, const Array& b);
Array not_equal(const Array& a, const Array& b);
Array less(const Array& a, const Array& b);
Array less_equal(const Array& a, const Array& b);
Array greater(const Array& a, const Array& b);
Array greater_equal(const Array& a, const Array& b);
Array equal(const Array& a, Scalar b);
Array not_equal(const Array& a, Scalar b);
Array less(const Array& a, Scalar b);
Array less_equal(const Array& a, Scalar b);
Array greater(const Array& a, Scalar b);
Array greater_equal(const Array& a, Scalar b);
Array logical_and(const Array& a, const Array& b);
Array logical_or(const Array& a, const Array& b);
/// out += b in place (b broadcast to out's shape; same dtype and device, as for add). No
/// allocation: gradient accumulation into persistent buffers uses it. `b` may be `out` itself
/// but must not otherwise overlap it. See Note [Elementwise kernels write in place].
void add_to(Array& out, const Array& b);
/// out *= b in place (a float scalar needs a floating array). See add_to.
void multiply_to(Array& out, Scalar b);
/// cond ? a : b, broadcasting all three; cond must be bool.
Array where(const Array& cond, const Array& a, const Array& b);
Array where(const Array& cond, const Array& a, Scalar b);
Array where(const Array& cond, Scalar a, const Array& b);
/// gy where y > 0, else 0 (broadcasting; one dtype, not bool): the gradient of relu through its
/// output y. One fused pass where the backend's kernel takes the case, else where(y > 0, gy, 0).
Array relu_grad(const Array& gy, const Array& y);

Array operator+(const Array& a, const Array& b);
Array operator-(const Array& a, const Array& b);
Array operator*(const Array& a, const Array& b);
Array operator/(const Array& a, const Array& b);
Array operator-(const Array& a);
Array operator+(const Array& a, Scalar b);
Array operator-(const Array& a, Scalar b);
Array operator*(const Array& a, Scalar b);
Array operator/(const Array& a, Scalar b);
Array operator+(Scalar a, const Array& b);
Array operator-(Scalar a, const Array& b);
Array operator*(Scalar a, const Array& b);
Array operator/(Scalar a, const Array& b);

// --- reductions ---------------------------------------------------------------------------------
/// Sum over `axes` (all axes when empty).
Array sum(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array mean(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array prod(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array amax(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array amin(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array any(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array all(const Array& x, const Axes& axes = {}, bool keepdims = false);
/// Variance with `ddof` delta degrees of freedom.
Array var(const Array& x, const Axes& axes = {}, bool keepdims = false, int ddof = 0);
/// Index of the maximum along `axis` (of the flattened array when absent); int64.
Array argmax(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
Array argmin(const Array& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
/// Sums `x` down to `shape` (the adjoint of broadcast_to); `shape` must broadcast to x's shape.
Array sum_to(const Array& x, const Shape& shape);
/// log(sum(exp(x))) over axes, computed stably.
Array logsumexp(const Array& x, const Axes& axes = {}, bool keepdims = false);
Array softmax(const Array& x, int axis = 1);
Array log_softmax(const Array& x, int axis = 1);

// --- linear algebra -------------------------------------------------------------------------------
/// NumPy matmul: 1-d operands are promoted; batch axes broadcast.
Array matmul(const Array& a, const Array& b);

// --- joining, splitting, indexing -------------------------------------------------------------------
Array concatenate(const std::vector<Array>& xs, int axis = 0);
Array stack(const std::vector<Array>& xs, int axis = 0);
/// Splits into `sections` equal parts along axis (views).
std::vector<Array> split(const Array& x, int64_t sections, int axis = 0);
/// Splits at the given indices along axis (views).
std::vector<Array> split_at(const Array& x, const std::vector<int64_t>& indices, int axis = 0);
/// Elements of x at integer `indices` along `axis` (indices int32/int64; negative wrap).
Array take(const Array& x, const Array& indices, int axis = 0);
/// The gradient of take: zeros of `shape` with `values` added at `indices` along `axis`.
Array add_at_zeros(const Shape& shape, const Array& indices, int axis, const Array& values);

// --- neural-network kernels ---------------------------------------------------------------------------
/// Output length of a convolution / pooling window sweep (Chainer's get_conv_outsize).
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation = 1,
                      bool cover_all = false);
/// y = conv2d(x, w) + b for NCHW x and OIHW w (b may be undefined).
Array conv2d(const Array& x, const Array& w, const Array& b, const Conv2dParams& p);
/// The gradient of conv2d with respect to x, for an x of shape `x_shape`.
Array conv2d_backward_data(const Array& w, const Array& gy, const Shape& x_shape, const Conv2dParams& p);
/// gx += the gradient of conv2d with respect to x, in place (cuDNN adds in the same pass); gx
/// must not overlap w or gy.
void conv2d_backward_data_accumulate(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx);
/// The gradient of conv2d with respect to w, for a w of shape `w_shape`.
Array conv2d_backward_filter(const Array& x, const Array& gy, const Shape& w_shape, const Conv2dParams& p);
Array pool2d(const Array& x, const Pool2dParams& p);
Array pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p);

// --- optimizer updates ---------------------------------------------------------------------------
/// One fused optimizer step: updates `param` and the arrays in `state` in place from `grad`, with
/// the rule's hyperparameters in `hyper`, in this order (flags as 0 or 1; formulas:
/// Note [Update rule layouts]):
///
///   rule          hyper                                                      state
///   kSgd          lr                                                         -
///   kMomentumSgd  lr, momentum                                               v
///   kNesterov     lr, momentum                                               v
///   kAdam         alpha_t, beta1, beta2, eps, eta, weight_decay_rate,        m, v (, vhat)
///                 amsgrad (1 needs the third state vhat)
///   kRmsprop      lr, alpha, eps, eps_inside_sqrt                            ms
///   kAdaGrad      lr, eps                                                    h
///   kRmspropWarmup  sgd_lr, rmsprop_lr, momentum, alpha, eps                 ms, v
///
/// The routine turns them into the kernel's typed parameters after checking the count. param,
/// grad and every state array must be on one device and have one floating dtype and one shape; param and the states must be contiguous (grad is copied when not).
/// With `skip` (a one-element int64 array on the parameter's device), the step is taken only
/// where *skip is 0, decided on the device when the kernel runs: a nonzero count leaves param and
/// state untouched, without the host reading it (Note [Dynamic loss scaling]).
void update_parameter(UpdateRule rule, Array& param, const Array& grad,
                      const std::vector<Array*>& state, const std::vector<double>& hyper,
                      const Array* skip = nullptr);
/// update_parameter on many parameters at once: one step of `rule` with the same `hyper` on
/// every params[i] from grads[i] with states[i] (each list as update_parameter's state, all of
/// one length), in a few kernel launches for all of them (on a GPU one per 64 tensors, with no
/// host-to-device copy, so it can be captured in a CUDA graph). The parameters share one device
/// and one floating dtype; each is checked as update_parameter checks it, and each element is
/// computed exactly as update_parameter computes it (the same bits). See Note [Multi-tensor
/// updates].
void update_parameters(UpdateRule rule, const std::vector<Array*>& params,
                       const std::vector<Array>& grads,
                       const std::vector<std::vector<Array*>>& states,
                       const std::vector<double>& hyper, const Array* skip = nullptr);
/// The number of Inf and NaN values in all of `arrays` (floating, on one device, of any shapes
/// and floating dtypes), as one int64 on that device, not read back: one pass over the memory,
/// and on a GPU one launch per dtype for up to 48 arrays (dynamic loss scaling counts a model's
/// gradients with it, Note [Dynamic loss scaling]).
Array count_nonfinite(const std::vector<Array>& arrays);
/// The rule's name for messages ("Adam", "MomentumSGD", ...).
const char* update_rule_name(UpdateRule rule);

// --- comparisons for tests and checks -------------------------------------------------------------
/// True when |a - b| <= atol + rtol |b| everywhere (NaNs equal when equal_nan).
bool allclose(const Array& a, const Array& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
/// True when shapes and all elements are equal.
bool array_equal(const Array& a, const Array& b);

// --- helpers for routines and kernels ------------------------------------------------------------------
/// Throws DeviceError naming `fn` unless all defined arrays are on the same device.
void check_same_device(const char* fn, std::initializer_list<const Array*> arrays);
/// Throws DtypeError naming `fn` unless all arrays have the same dtype.
void check_same_dtype(const char* fn, std::initializer_list<const Array*> arrays);
/// Throws DtypeError naming `fn` unless x has a floating dtype.
void check_floating(const char* fn, const Array& x);

}  // namespace kusari
