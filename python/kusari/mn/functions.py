"""Differentiable communication (ChainerMN's chainermn.functions): send/recv with delegate
variables, pseudo_connect, and the collectives allgather, alltoall, bcast, gather, scatter."""

from kusari._kusari.mn.functions import (allgather, alltoall, bcast, gather, pseudo_connect, recv,  # noqa: F401
                                         scatter, send)
