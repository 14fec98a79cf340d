# Rank 1 raises at its third step while the others go on into the gradient allreduce (or, with
# --all, every rank raises the same error there): the job must end with one report.
import sys
import time

import numpy as np

import kusari
import kusari.functions as F
import kusari.links as L
import kusari.mn

every = '--all' in sys.argv
comm = kusari.mn.create_communicator('naive')
model = L.Linear(4, 2)
x = np.random.rand(8, 4).astype(np.float32)
for step in range(1000):
    if every and step == 3:
        # (Every rank finishes its waits of step 2 first: a rank still waiting when another fails
        # ends quietly, as it should, and would be missing from the report's list.)
        time.sleep(0.3)
        raise RuntimeError('python failure at step 3 on every rank')
    if comm.rank == 1 and step == 3:
        raise RuntimeError('python failure at step 3')
    model.cleargrads()
    F.sum(F.square(model(x))).backward()
    comm.multi_node_mean_grad(model, True)
print('rank {} finished without noticing the failure'.format(comm.rank))
