// All trainer extensions (Chainer's chainer.training.extensions), in namespace
// kusari::training::extensions:
//
//   namespace ext = kusari::training::extensions;
//   trainer.extend(ext::Evaluator(test_iter, model));
//   trainer.extend(ext::LogReport());
//   trainer.extend(ext::PrintReport({"epoch", "main/loss", "validation/main/loss",
//   "elapsed_time"})); trainer.extend(ext::ProgressBar());
#pragma once

#include "kusari/training/extension.h"
#include "kusari/training/extensions/epoch_shift.h"
#include "kusari/training/extensions/evaluator.h"
#include "kusari/training/extensions/exponential_shift.h"
#include "kusari/training/extensions/fail_on_non_number.h"
#include "kusari/training/extensions/linear_shift.h"
#include "kusari/training/extensions/log_report.h"
#include "kusari/training/extensions/plot_report.h"
#include "kusari/training/extensions/print_report.h"
#include "kusari/training/extensions/progress_bar.h"
#include "kusari/training/extensions/snapshot.h"
#include "kusari/training/extensions/value_observation.h"
#include "kusari/training/summary.h"
#include "kusari/training/terminal.h"
