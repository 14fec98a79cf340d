#include "mn/reduce/powersgd.h"

#include <algorithm>
#include <cmath>

#include "kusari/core/random.h"
#include "kusari/core/routines.h"
#include "mn/reduce/gradient_buffer.h"

namespace kusari::mn::detail {

// Note [PowerSGD]
// Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
// Distributed Optimization" (2019). Each gradient of n x m elements (its first axis by the rest:
// a linear layer's W, a convolution's filters) is handled as a matrix M. Per step:
//   M <- M + E                 the error feedback: what earlier approximations left out, locally
//   P <- M Q                   n x r, Q (m x r) being the previous step's (the same on every process)
//   P <- mean over processes   one allreduce of every matrix's P, packed
//   P <- orthonormal columns
//   Q <- M^T P                 m x r
//   Q <- mean over processes   one allreduce of every Q, packed
//   M' = P Q^T                 the averaged gradient, approximated: P P^T mean(M)
//   E <- M - M'
// Since Q is the same on every process, mean(M_i Q) = mean(M) Q, so M' is the projection of the
// mean gradient onto the span of P: with r at least the rank of the mean, it is the mean itself.
// A process sends r (n + m) numbers per matrix instead of n m. Vectors (biases, normalisation
// scales) and matrices where that saves less than min_ratio, and every gradient during the first
// start_step steps (the error feedback hurts while the gradients change fast), are averaged
// exactly in one more allreduce. P, Q and E are float32 on the gradient's device; the first Q is
// drawn from a generator seeded alike on every process (seed + the matrix's index). Missing
// gradients count as zeros. The error feedback and Q are not saved in snapshots: a resumed run
// starts them again (a few steps of warm-up).

void orthonormalize_columns(Array& p) {
  const int64_t r = p.shape()[1];
  auto norm_of = [](const Array& v) {
    return std::sqrt(sum(v * v).astype(Dtype::kFloat64).to_device(Device::cpu()).item<double>());
  };
  for (int64_t j = 0; j < r; ++j) {
    Array col = p.at({Slice(), j});
    const double before = norm_of(col);
    for (int64_t k = 0; k < j; ++k) {
      Array prev = p.at({Slice(), k});
      col.assign(col - prev * sum(col * prev));
    }
    const double norm = norm_of(col);
    // (A column that depends on those before leaves rounding noise: zero it rather than blow the
    // noise up into a spurious direction.)
    if (norm > 1e-4 * before && norm > 0) {
      col.assign(col * (1.0 / norm));
    } else {
      col.fill(0.0);
    }
  }
}

PowerSgdReducer::PowerSgdReducer(std::shared_ptr<Communicator> comm, int rank, double min_ratio, int64_t start_step,
                                 uint64_t seed)
    : comm_(std::move(comm)), rank_(rank), min_ratio_(min_ratio), start_step_(start_step), seed_(seed) {
  KUSARI_CHECK(rank_ > 0, ValueError, "PowerSGD: the rank must be positive, got ", rank_);
}

void PowerSgdReducer::forget() {
  matrices_.clear();
  plain_.clear();
  steps_ = 0;
}

PowerSgdReducer::Matrix* PowerSgdReducer::matrix_of(const std::string& path, const Array& g) {
  for (Matrix& m : matrices_) {
    if (m.path == path) return &m;
  }
  if (std::find(plain_.begin(), plain_.end(), path) != plain_.end()) return nullptr;
  const int64_t n = g.ndim() >= 2 ? g.shape()[0] : 0;
  const int64_t cols = n > 0 ? g.size() / n : 0;
  const int64_t r = std::min<int64_t>({rank_, n, cols});
  if (n == 0 || r == 0 || !is_floating(g.dtype()) ||
      static_cast<double>(n) * static_cast<double>(cols) < min_ratio_ * static_cast<double>(r * (n + cols))) {
    plain_.push_back(path);
    return nullptr;
  }
  Matrix m;
  m.path = path;
  m.n = n;
  m.m = cols;
  m.r = r;
  Generator gen(seed_ + matrices_.size() + 1);
  m.q = Array::normal({cols, r}, 0.0, 1.0, Dtype::kFloat32, g.device(), &gen);
  m.error = Array::zeros({n, cols}, Dtype::kFloat32, g.device());
  matrices_.push_back(std::move(m));
  return &matrices_.back();
}

void PowerSgdReducer::mean_grad(Link& model) {
  auto named = model.namedparams(false);
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [path, p] : named) {
    if (!p.grad().defined()) p.set_grad(Array::zeros_like(p.data()));
  }
  stats_ = {};
  const bool compress = steps_++ >= start_step_ && comm_->size() > 1;
  NamedParams exact;
  struct Work {
    Parameter param;
    Matrix* matrix;
    Array m;  // n x m float32: the gradient plus the error feedback
    Array p;
  };
  std::vector<Work> work;
  for (auto& [path, p] : named) {
    stats_.bytes_uncompressed += p.grad().nbytes();
    Matrix* mat = compress ? matrix_of(path, p.grad()) : nullptr;
    if (mat == nullptr) {
      exact.emplace_back(path, p);
      continue;
    }
    Array g = p.grad();
    Array m = g.reshape({mat->n, mat->m}).astype(Dtype::kFloat32) + mat->error;
    work.push_back(Work{p, mat, m, Array()});
  }
  stats_.compressed = static_cast<int64_t>(work.size());
  stats_.exact = static_cast<int64_t>(exact.size());

  // The exact ones: one allreduce per dtype (packed), the mean as the flat reducer takes it.
  std::vector<Dtype> dtypes;
  for (auto& [path, p] : exact) {
    if (std::find(dtypes.begin(), dtypes.end(), p.dtype()) == dtypes.end()) dtypes.push_back(p.dtype());
  }
  for (Dtype dtype : dtypes) {
    NamedParams group;
    for (auto& e : exact) {
      if (e.second.dtype() == dtype) group.push_back(e);
    }
    const Dtype wire = comm_->options().allreduce_grad_dtype.value_or(dtype);
    int64_t total = 0;
    for (auto& [path, p] : group) total += p.size();
    Array buffer = Array::empty({total}, wire, Device::cpu());
    int64_t at = 0;
    for (auto& [path, p] : group) {
      buffer.at({Slice(at, at + p.size())}).assign(p.grad().to_device(Device::cpu()).reshape({p.size()}).astype(wire));
      at += p.size();
    }
    comm_->allreduce_inplace(buffer, ReduceOp::kSum);
    stats_.bytes_sent += buffer.nbytes();
    // Scaled as the flat reducer scales (16-bit values in float32, rounded once).
    Array mean = (is_half_precision(wire) ? buffer.astype(Dtype::kFloat32) : buffer) * (1.0 / comm_->size());
    at = 0;
    for (auto& [path, p] : group) {
      Array g = p.grad();
      g.assign(mean.at({Slice(at, at + p.size())}).astype(g.dtype()).reshape(g.shape()).to_device(g.device()));
      at += p.size();
    }
  }
  if (work.empty()) return;

  // P = M Q for every matrix, averaged in one allreduce.
  auto allreduce_packed = [&](std::vector<Array*> parts) {
    int64_t total = 0;
    for (Array* a : parts) total += a->size();
    Array buffer = Array::empty({total}, Dtype::kFloat32, Device::cpu());
    int64_t at = 0;
    for (Array* a : parts) {
      buffer.at({Slice(at, at + a->size())}).assign(a->to_device(Device::cpu()).reshape({a->size()}));
      at += a->size();
    }
    comm_->allreduce_inplace(buffer, ReduceOp::kMean);
    stats_.bytes_sent += buffer.nbytes();
    at = 0;
    for (Array* a : parts) {
      *a = buffer.at({Slice(at, at + a->size())}).reshape(a->shape()).to_device(a->device()).copy();
      at += a->size();
    }
  };
  std::vector<Array*> ps, qs;
  for (Work& w : work) {
    w.p = matmul(w.m, w.matrix->q);
    ps.push_back(&w.p);
  }
  allreduce_packed(ps);
  for (Work& w : work) {
    orthonormalize_columns(w.p);
    w.matrix->q = matmul(w.m.transpose(), w.p);
    qs.push_back(&w.matrix->q);
  }
  allreduce_packed(qs);
  for (Work& w : work) {
    const Array approx = matmul(w.p, w.matrix->q.transpose());
    w.matrix->error = w.m - approx;
    Array g = w.param.grad();
    g.assign(approx.astype(g.dtype()).reshape(g.shape()));
  }
}

}  // namespace kusari::mn::detail
