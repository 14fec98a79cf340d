"""chainer.training.triggers over kusari.training.triggers."""

from kusari.training.triggers import *  # noqa: F401,F403
from kusari.training.triggers import (EarlyStoppingTrigger, IntervalTrigger, ManualScheduleTrigger,  # noqa: F401
                                      MaxValueTrigger, MinValueTrigger, get_trigger)
