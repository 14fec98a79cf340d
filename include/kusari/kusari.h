// The whole single-process library: arrays, autograd, functions (and, as they land, links,
// optimizers, training). Multi-node training is in kusari/mn.h.
#pragma once

#include "kusari/config.h"
#include "kusari/core/array.h"
#include "kusari/core/device.h"
#include "kusari/core/dtype.h"
#include "kusari/core/error.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"
#include "kusari/core/threads.h"
#include "kusari/autograd/function_node.h"
#include "kusari/autograd/gradient_check.h"
#include "kusari/autograd/mode.h"
#include "kusari/autograd/variable.h"
#include "kusari/functions.h"
#include "kusari/training/extension.h"
#include "kusari/training/extensions.h"
#include "kusari/training/summary.h"
#include "kusari/training/trainer.h"
#include "kusari/training/trigger.h"
#include "kusari/training/updater.h"
