"""chainer.reporter: report() into the trainer's observation."""

from kusari.training import report  # noqa: F401
