"""kusari.mn under mpiexec (CTest: -n 2 and -n 3): communicators, collectives of arrays and of
picklable objects, scatter_dataset of Python sequences, the multi-node optimizer, evaluator and
batch normalization, and the differentiable communication."""

import numpy as np
import pytest

import kusari
import kusari.functions as F
import kusari.links as L
import kusari.mn

comm = kusari.mn.create_communicator('naive')


def test_topology():
    assert 0 <= comm.rank < comm.size >= 2
    assert comm.intra_size * comm.inter_size == comm.size and comm.name == 'naive'


def test_object_collectives():
    obj = {'rank': comm.rank, 'payload': np.arange(comm.rank + 1)}
    assert comm.bcast_obj(obj if comm.rank == 0 else None)['rank'] == 0
    gathered = comm.gather_obj(obj)
    if comm.rank == 0:
        assert [g['rank'] for g in gathered] == list(range(comm.size))
    else:
        assert gathered is None
    assert [g['rank'] for g in comm.allgather_obj(obj)] == list(range(comm.size))
    assert comm.allreduce_obj(comm.rank + 1) == comm.size * (comm.size + 1) // 2
    assert comm.allreduce_obj(np.ones(2)).tolist() == [comm.size] * 2
    if comm.rank == 0:
        comm.send_obj(('hello', [1, 2]), 1)
    elif comm.rank == 1:
        assert comm.recv_obj(0) == ('hello', [1, 2])


def test_array_collectives():
    x = np.full(3, comm.rank, np.float32)
    np.testing.assert_array_equal(comm.allreduce(x), np.full(3, sum(range(comm.size))))
    np.testing.assert_array_equal(comm.allreduce(x, op='max'), np.full(3, comm.size - 1))
    parts = comm.allgather(x)
    assert [p[0] for p in parts] == list(range(comm.size))
    np.testing.assert_array_equal(comm.bcast(x if comm.rank == 0 else None), np.zeros(3))
    comm.barrier()


def test_reduce_scatter_and_all_gather():
    n, r = comm.size, comm.rank
    x = np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3) * (r + 1)
    base = np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3)
    np.testing.assert_array_equal(comm.reduce_scatter(x), base[2 * r:2 * r + 2] * (n * (n + 1) // 2))
    np.testing.assert_array_equal(comm.all_gather(np.full(2, r, np.int64)), np.repeat(np.arange(n), 2))
    with pytest.raises(ValueError, match='multiple'):
        comm.reduce_scatter(np.ones(2 * n + 1, np.float32))


def test_sharded_optimizer_equals_the_replicated_one():
    kusari.manual_seed(0)
    models = [L.Classifier(L.Linear(5, 7)) for _ in range(4)]
    for m in models[1:]:
        m.copyparams(models[0])
    opts = [kusari.mn.create_multi_node_optimizer(kusari.optimizers.Adam(), comm, zero_stage=stage, **extra)
            for stage, extra in ((0, {}), (1, {}), (2, {'overlap': True}), (3, {'bucket_mb': 1e-5}))]
    for model, opt in zip(models, opts):
        opt.setup(model)
        rng = np.random.RandomState(comm.rank)
        for _ in range(4):
            x, t = rng.randn(8, 5).astype(np.float32), rng.randint(0, 7, 8).astype(np.int32)
            opt.update(model, x, t)
    np.testing.assert_array_equal(models[1].predictor.W.array, models[0].predictor.W.array)
    # Stage 3 keeps the parameters in the shards between steps and gathers them when read.
    stats = kusari.mn.shard_stats(opts[3])
    assert stats['stage'] == 3 and stats['whole_elements'] == 0 and stats['units'] >= 2
    np.testing.assert_array_equal(models[3].predictor.W.array, models[2].predictor.W.array)
    np.testing.assert_allclose(models[3].predictor.W.array, models[0].predictor.W.array, rtol=1e-5, atol=1e-6)
    kusari.mn.summon_full_parameters(opts[3])
    assert kusari.mn.shard_stats(opts[3])['whole_elements'] == stats['total_elements']
    with pytest.raises(TypeError, match='multi-node'):
        kusari.mn.shard_stats(kusari.optimizers.Adam())


def test_sharded_snapshot_files_load_together_and_merge(tmp_path_factory):
    kusari.manual_seed(0)
    model = L.Classifier(L.Linear(5, 7))
    opt = kusari.mn.create_multi_node_optimizer(kusari.optimizers.Adam(), comm, zero_stage=2)
    opt.setup(model)
    rng = np.random.RandomState(comm.rank)
    for _ in range(3):
        x, t = rng.randn(8, 5).astype(np.float32), rng.randint(0, 7, 8).astype(np.int32)
        opt.update(model, x, t)
    folder = comm.bcast_obj(str(tmp_path_factory.mktemp('sharded')) if comm.rank == 0 else None)
    files = ['%s/opt.%d' % (folder, q) for q in range(comm.size)]
    kusari.serializers.save_npz(files[comm.rank], opt)
    comm.barrier()
    assert 'updater' not in ''.join(np.load(files[comm.rank]).files)
    layout = np.load(files[comm.rank])['mn_shard_layout']
    assert '"processes":%d' % comm.size in bytes(layout).decode()
    # One file alone is refused; the files together give the whole state to an unsharded optimizer.
    plain = kusari.optimizers.Adam()
    plain.setup(model)
    with pytest.raises(OSError, match='load_snapshot_files'):
        kusari.serializers.load_npz(files[comm.rank], plain)
    kusari.mn.load_snapshot_files(files, plain, own=comm.rank)
    if comm.rank == 0:
        merged = folder + '/merged.npz'
        kusari.mn.merge_snapshot_files(files, merged)
        whole = np.load(merged)
        assert 'mn_shard_layout' not in whole.files
        assert whole['predictor/W/m'].shape == (7, 5)
        again = kusari.optimizers.Adam()
        again.setup(model)
        kusari.serializers.load_npz(merged, again)
        assert again.t == plain.t == 2
    comm.barrier()


def test_powersgd_keeps_the_ranks_equal_and_sends_less():
    kusari.manual_seed(comm.rank)
    model = L.Classifier(L.Linear(64, 32))
    opt = kusari.mn.create_multi_node_optimizer(kusari.optimizers.MomentumSGD(), comm, powersgd_rank=2)
    opt.setup(model)
    rng = np.random.RandomState(comm.rank)
    for _ in range(3):
        x, t = rng.randn(8, 64).astype(np.float32), rng.randint(0, 32, 8).astype(np.int32)
        opt.update(model, x, t)
    weights = comm.allgather(model.predictor.W.array)
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])


def test_join_lets_processes_take_different_numbers_of_steps():
    kusari.manual_seed(comm.rank)
    model = L.Classifier(L.Linear(5, 3))
    opt = kusari.mn.create_multi_node_optimizer(kusari.optimizers.MomentumSGD(), comm)
    opt.setup(model)
    rng = np.random.RandomState(comm.rank)
    with kusari.mn.Join(opt) as join:
        for _ in range(1 + 2 * comm.rank):
            x, t = rng.randn(8, 5).astype(np.float32), rng.randint(0, 3, 8).astype(np.int32)
            opt.update(model, x, t)
    assert join.shadow_steps == 2 * (comm.size - 1 - comm.rank)
    weights = comm.allgather(model.predictor.W.array)
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])


def test_scatter_dataset_of_a_python_list():
    data = [(np.float32(i), np.int32(i % 3)) for i in range(11)] if comm.rank == 0 else None
    part = kusari.mn.scatter_dataset(data, comm, shuffle=True, seed=0)
    values = sorted(float(e[0]) for e in part)
    everything = sorted(v for vs in comm.allgather_obj(values) for v in vs)
    assert set(everything) == set(range(11))


def test_distributed_iterator_parts_cover_each_global_batch():
    data = [(np.float32(i), np.int32(i % 3)) for i in range(30)]  # every rank holds all of it
    it = kusari.mn.DistributedIterator(data, 2, comm)
    assert it.global_batch_size == 2 * comm.size and it.batch_size == 2 and it.learning_rate_factor == 1.0
    seen = []
    for _ in range(3):
        mine = it.next_indices()
        assert len(mine) == 2
        seen += [i for part in comm.allgather_obj(mine) for i in part]
    # One order shared by every rank: the parts of 3 steps never overlap.
    assert len(set(seen)) == 6 * comm.size
    batch = it.next()
    assert len(batch) == 2
    with pytest.raises(ValueError, match="resize is 'both'"):
        kusari.mn.DistributedIterator(data, 2, comm, resize='both')


def test_multi_node_optimizer_keeps_the_ranks_equal():
    kusari.manual_seed(comm.rank)  # different initial weights: the first update broadcasts rank 0's
    model = L.Classifier(L.Linear(4, 3))
    opt = kusari.mn.create_multi_node_optimizer(kusari.optimizers.Adam(), comm)
    opt.setup(model)
    rng = np.random.RandomState(comm.rank)
    for _ in range(3):
        x, t = rng.randn(8, 4).astype(np.float32), rng.randint(0, 3, 8).astype(np.int32)
        opt.update(model, x, t)
    weights = comm.allgather(model.predictor.W.array)
    for w in weights[1:]:
        np.testing.assert_array_equal(w, weights[0])
    opt.alpha = 0.5
    assert opt.alpha == 0.5


def test_multi_node_evaluator_averages_over_all_examples():
    x = np.arange(20, dtype=np.float32).reshape(20, 1)
    t = (np.arange(20) % 2).astype(np.int32)
    data = kusari.datasets.TupleDataset(x, t)
    part = kusari.mn.scatter_dataset(data, comm, force_equal_length=False)
    model = L.Classifier(L.Linear(1, 2))
    model.predictor.W.array[...] = np.array([[0.0], [1.0]], np.float32)
    model.predictor.b.array[...] = np.array([10.0, 0.0], np.float32)
    it = kusari.iterators.SerialIterator(part, 3, repeat=False, shuffle=False)
    ev = kusari.mn.create_multi_node_evaluator(kusari.training.extensions.Evaluator(it, model), comm)
    result = ev.evaluate()
    # class 1 wins for x > 10: right for the odd x above 10 and the even x up to 10.
    expected = np.mean([(xv > 10) == (xv % 2 == 1) for xv in range(20)])
    assert result['validation/main/accuracy'] == pytest.approx(expected)


def test_multi_node_batch_normalization_sees_every_rank():
    x = np.full((2, 3), comm.rank, np.float32)
    bn = kusari.mn.MultiNodeBatchNormalization(3, comm)
    y = bn(x)
    mean = sum(range(comm.size)) / comm.size
    assert bn.avg_mean == pytest.approx(0.1 * mean) or np.allclose(bn.avg_mean, 0.1 * mean)
    assert y.shape == (2, 3)


def test_differentiable_send_and_recv():
    if comm.rank == 0:
        x = kusari.Variable(np.array([1.0, 2.0], np.float32))
        delegate = kusari.mn.functions.send(x * 3, comm, 1)
        delegate.backward()
        np.testing.assert_array_equal(x.grad, [6.0, 6.0])  # d(sum(2 * y))/dx with y = 3x
    elif comm.rank == 1:
        y = kusari.mn.functions.recv(comm, 0)
        F.sum(2 * y).backward()
    comm.barrier()


def test_errors_become_communicator_errors():
    if not kusari.build_info()['nccl']:
        with pytest.raises(kusari.mn.CommunicatorError):
            kusari.mn.create_communicator('pure_nccl')
    with pytest.raises(ValueError, match='naive'):
        kusari.mn.create_communicator('no_such_kind')
