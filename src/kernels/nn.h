// Kernels: 2-d convolution and pooling over NCHW data. See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"
#include "kusari/core/op_types.h"

namespace kusari::kernels {

/// y = conv(x, w) + b (b may be undefined); y is contiguous.
inline constinit Kernel<void(const Array& x, const Array& w, const Array& b, const Conv2dParams& p, Array& y)>
    conv2d_forward{"conv2d_forward"};
/// gx = conv_transpose(gy, w), the gradient of conv2d with respect to x; with `accumulate`,
/// gx += conv_transpose(gy, w) (gx is then read, and written whatever its layout).
inline constinit Kernel<void(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx, bool accumulate)>
    conv2d_backward_data{"conv2d_backward_data"};
/// gw = the gradient of conv2d with respect to w.
inline constinit Kernel<void(const Array& x, const Array& gy, const Conv2dParams& p, Array& gw)>
    conv2d_backward_filter{"conv2d_backward_filter"};
inline constinit Kernel<void(const Array& x, const Pool2dParams& p, Array& y)> pool2d_forward{"pool2d_forward"};
/// gx for pooling; max pooling routes gy to the first maximum of each window of x.
inline constinit Kernel<void(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p, Array& gx)>
    pool2d_backward{"pool2d_backward"};

}  // namespace kusari::kernels
