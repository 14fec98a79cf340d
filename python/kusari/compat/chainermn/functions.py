"""chainermn.functions: differentiable communication."""

from kusari.mn.functions import *  # noqa: F401,F403
