"""chainermn.links: MultiNodeBatchNormalization and create_mnbn_model."""

from kusari.mn import MultiNodeBatchNormalization, create_mnbn_model  # noqa: F401
