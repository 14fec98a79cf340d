"""chainer.training.extensions over kusari.training.extensions."""

from kusari.training.extensions import *  # noqa: F401,F403
from kusari.training.extensions import (DumpGraph, Evaluator, ExponentialShift, Extension,  # noqa: F401
                                        FailOnNonNumber, LinearShift, LogReport, PlotReport, PrintReport,
                                        ProgressBar, make_extension, observe_lr, observe_value, snapshot,
                                        snapshot_object)
