"""npz serialization (Chainer's chainer.serializers): Chainer's key layout, NumPy-readable files."""

from kusari._kusari.serializers import Serializer, load_npz, save_npz  # noqa: F401
