// All differentiable functions (Chainer's chainer.functions). Users often write
//   namespace F = kusari::functions;
#pragma once

#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/attention.h"
#include "kusari/functions/connection.h"
#include "kusari/functions/convolution.h"
#include "kusari/functions/detection.h"
#include "kusari/functions/evaluation.h"
#include "kusari/functions/loss.h"
#include "kusari/functions/lstm.h"
#include "kusari/functions/math.h"
#include "kusari/functions/noise.h"
#include "kusari/functions/normalization.h"
#include "kusari/functions/pooling.h"
#include "kusari/functions/rnn.h"
