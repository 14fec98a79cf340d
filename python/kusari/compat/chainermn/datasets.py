"""chainermn.datasets: scatter_dataset and create_empty_dataset."""

from kusari.mn import create_empty_dataset, scatter_dataset, scatter_index  # noqa: F401
