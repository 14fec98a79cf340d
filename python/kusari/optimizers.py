"""Optimizers (Chainer's chainer.optimizers): kusari's C++ optimizers.

Hyperparameters are attributes: ``opt.lr = 0.01``, ``opt.alpha``; ``opt.setup(model)``,
``opt.update()`` or ``opt.update(lossfun, *args)``, ``opt.add_hook(hook)``.
"""

from kusari._kusari import optimizers as _o

Optimizer = _o.Optimizer


def _setattr(self, name, value):
    if not name.startswith('_') and self._has_hyperparam(name):
        self._set_hyperparam(name, float(value))
    else:
        object.__setattr__(self, name, value)


Optimizer.__setattr__ = _setattr

SGD = _o.SGD
MomentumSGD = _o.MomentumSGD
NesterovAG = _o.NesterovAG
Adam = _o.Adam
AdamW = _o.AdamW
RMSprop = _o.RMSprop
AdaGrad = _o.AdaGrad
RMSpropWarmup = _o.RMSpropWarmup
LARS = _o.LARS
LAMB = _o.LAMB
is_bias_or_norm = _o.is_bias_or_norm
