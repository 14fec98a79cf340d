// All links (Chainer's chainer.links) and the Link / Chain / ChainList / Sequential base classes.
// Users often write
//   namespace L = kusari::links;
#pragma once

#include "kusari/links/batch_normalization.h"
#include "kusari/links/classifier.h"
#include "kusari/links/convolution_2d.h"
#include "kusari/links/deconvolution_2d.h"
#include "kusari/links/embed_id.h"
#include "kusari/links/initializers.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/links/lstm.h"
#include "kusari/links/transformer.h"
