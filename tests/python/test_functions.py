"""kusari.functions from Python: every C++ function is there, takes Chainer's arguments, and its
gradient through the bindings matches a numerical one."""

import os
import re

import numpy as np
import pytest

import kusari
import kusari.functions as F
from conftest import check_backward

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')


def cpp_function_names():
    names = set()
    folder = os.path.join(SOURCE, 'include', 'kusari', 'functions')
    for header in os.listdir(folder):
        text = open(os.path.join(folder, header)).read()
        for m in re.finditer(r'^(?:Variable|std::\w+<[^(\n]*>) (\w+)\(', text, re.M):
            names.add(m.group(1))
    return names


def test_every_cpp_function_is_bound():
    missing = sorted(n for n in cpp_function_names() if not hasattr(F, n))
    assert not missing, 'kusari.functions lacks {}'.format(missing)


def test_forward_against_numpy(rng):
    x = rng.randn(3, 5).astype(np.float32)
    np.testing.assert_allclose(F.softmax(x).array, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(F.log_softmax(x, axis=0).array, x - np.log(np.exp(x).sum(0)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.sum(x, axis=1, keepdims=True).array, x.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(F.mean(x, axis=(0, 1)).array, x.mean(), rtol=1e-5)
    np.testing.assert_allclose(F.transpose(x).array, x.T)
    np.testing.assert_allclose(F.concat([x, x], axis=0).array, np.concatenate([x, x]))
    parts = F.split_axis(x, [1, 3], axis=1)
    assert [p.shape for p in parts] == [(3, 1), (3, 2), (3, 2)]
    np.testing.assert_allclose(F.where(x > 0, x, np.zeros_like(x)).array, np.maximum(x, 0))
    W, b = rng.randn(4, 5).astype(np.float32), rng.randn(4).astype(np.float32)
    np.testing.assert_allclose(F.linear(x, W, b).array, x @ W.T + b, rtol=1e-5, atol=1e-6)
    t = np.array([0, 4, 2], np.int32)
    loss = F.softmax_cross_entropy(x, t)
    expected = -np.mean(np.log(np.exp(x) / np.exp(x).sum(1, keepdims=True))[np.arange(3), t])
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert F.softmax_cross_entropy(x, t, reduce='no').shape == (3,)
    # Padding columns (a padded vocabulary) take no part: the loss of the first 5 columns.
    padded = np.concatenate([x, np.full((3, 3), 30.0, np.float32)], axis=1)
    assert F.softmax_cross_entropy_padded(padded, t, 5).item() == pytest.approx(expected, rel=1e-5)
    assert F.accuracy(x, t).item() == pytest.approx(np.mean(x.argmax(1) == t))
    with pytest.raises(ValueError, match="reduce must be 'mean' or 'no'"):
        F.softmax_cross_entropy(x, t, reduce='sum')


def test_convolution_and_pooling_arguments(rng):
    x = rng.randn(2, 3, 8, 8).astype(np.float32)
    W = rng.randn(4, 3, 3, 3).astype(np.float32)
    y = F.convolution_2d(x, W, stride=2, pad=1)
    assert y.shape == (2, 4, 4, 4)
    assert F.convolution_2d(x, W, None, (1, 2), (1, 0)).shape == (2, 4, 8, 3)
    assert F.max_pooling_2d(x, 2).shape == (2, 3, 4, 4)
    assert F.average_pooling_2d(x, 3, stride=1, pad=1).shape == (2, 3, 8, 8)
    assert F.deconvolution_2d(y, W, stride=2, pad=1, outsize=(8, 8)).shape == (2, 3, 8, 8)


@pytest.mark.parametrize('name,fn,shapes', [
    ('relu', lambda x: F.relu(x), [(3, 4)]),
    ('leaky_relu', lambda x: F.leaky_relu(x, 0.1), [(3, 4)]),
    ('elu', lambda x: F.elu(x), [(3, 4)]),
    ('sigmoid', lambda x: F.sigmoid(x), [(5,)]),
    ('tanh', lambda x: F.tanh(x), [(5,)]),
    ('softplus', lambda x: F.softplus(x, beta=2.0), [(5,)]),
    ('softmax', lambda x: F.softmax(x, axis=0), [(3, 4)]),
    ('log_softmax', lambda x: F.log_softmax(x), [(3, 4)]),
    ('linear', lambda x, W, b: F.linear(x, W, b), [(2, 3), (4, 3), (4,)]),
    ('matmul', lambda a, b: F.matmul(a, b, transb=True), [(2, 3), (4, 3)]),
    ('convolution_2d', lambda x, W: F.convolution_2d(x, W, pad=1), [(1, 2, 4, 4), (3, 2, 3, 3)]),
    ('max_pooling_2d', lambda x: F.max_pooling_2d(x, 2), [(1, 2, 4, 4)]),
    ('average_pooling_2d', lambda x: F.average_pooling_2d(x, 2), [(1, 2, 4, 4)]),
    ('batch_normalization', lambda x, g, b: F.batch_normalization(x, g, b), [(4, 3), (3,), (3,)]),
    ('sum_axis', lambda x: F.sum(x, axis=1), [(3, 4)]),
    ('logsumexp', lambda x: F.logsumexp(x, axis=0), [(3, 4)]),
    ('getitem', lambda x: x[1:, ::2], [(3, 4)]),
    ('concat', lambda a, b: F.concat([a, b], axis=1), [(2, 3), (2, 1)]),
    ('mean_squared_error', lambda a, b: F.mean_squared_error(a, b), [(3,), (3,)]),
    ('lstm_h', lambda c, x: F.lstm(c, x)[1], [(2, 3), (2, 12)]),
    ('gelu', lambda x: F.gelu(x), [(3, 4)]),
    ('gelu_tanh', lambda x: F.gelu(x, approximate='tanh'), [(3, 4)]),
    ('silu', lambda x: F.silu(x), [(5,)]),
    ('layer_normalization', lambda x, g, b: F.layer_normalization(x, g, b), [(3, 5), (5,), (5,)]),
    ('rms_normalization', lambda x, g: F.rms_normalization(x, g), [(3, 5), (5,)]),
    ('scaled_dot_product_attention', lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 2)]),
    ('embed_id_valid_ids', lambda W: F.embed_id(np.array([[0, 2], [2, -1]], np.int32), W, -1, valid_ids=3),
     [(5, 4)]),
])
def test_gradients_through_the_bindings(name, fn, shapes, rng):
    check_backward(fn, [rng.uniform(-1, 1, s) + (0.5 if name == 'max_pooling_2d' else 0) *
                        np.arange(np.prod(s)).reshape(s) for s in shapes])


def test_embed_id_valid_ids(rng):
    # valid_ids bounds the ids below W's rows (a padded vocabulary's): the ids below it look up as
    # without it, an id between it and the rows is refused, naming the function, the id and the range.
    W = rng.randn(5, 3).astype(np.float32)
    ids = np.array([[0, 2], [1, 2]], np.int32)
    np.testing.assert_array_equal(F.embed_id(ids, W, valid_ids=3).array, W[ids])
    with pytest.raises(IndexError, match=r'embed_id: id 4 .*expected 0 <= id < 3 \(the embedding\'s valid ids; '
                                         r'W of shape \(5, 3\) has 5 rows\)'):
        F.embed_id(np.array([0, 4], np.int32), W, valid_ids=3)
    with pytest.raises(IndexError, match=r'or id == ignore_label \(-1\)'):
        F.embed_id(np.array([-1, 3], np.int32), W, -1, valid_ids=3)
    for n in (0, 6):
        with pytest.raises(ValueError, match=r'embed_id: valid_ids must satisfy 0 < valid_ids <= 5'):
            F.embed_id(ids, W, valid_ids=n)
    # The gradient is the one without the bound: rows 3 and 4 receive zeros.
    Wv = kusari.Variable(W.astype(np.float64))
    F.sum(F.embed_id(ids, Wv, valid_ids=3)).backward()
    expected = np.zeros((5, 3))
    np.add.at(expected, ids.ravel(), 1.0)
    np.testing.assert_array_equal(np.asarray(Wv.grad), expected)
    # EmbedID takes the bound as a keyword and as a property.
    embed = kusari.links.EmbedID(5, 3, valid_ids=3)
    assert embed.valid_ids == 3
    np.testing.assert_array_equal(embed(ids).array, np.asarray(embed.W.array)[ids])
    with pytest.raises(IndexError, match='expected 0 <= id < 3'):
        embed(np.array([3], np.int32))
    embed.valid_ids = None
    assert embed.valid_ids is None
    assert embed(np.array([4], np.int32)).shape == (1, 3)
    with pytest.raises(ValueError, match='EmbedID: valid_ids must satisfy 0 < valid_ids <= in_size \\(5\\), got 6'):
        embed.valid_ids = 6
    with pytest.raises(ValueError, match='valid_ids'):
        kusari.links.EmbedID(5, 3, valid_ids=0)


def test_dropout_train_and_test():
    x = np.ones((100, 100), np.float32)
    y = F.dropout(x, 0.5).array
    assert 0.4 < (y == 0).mean() < 0.6 and set(np.unique(y)) <= {0.0, 2.0}
    with kusari.using_config('train', False):
        assert (F.dropout(x, 0.5).array == 1).all()


def test_transformer_functions_against_numpy(rng):
    x = rng.uniform(-3, 3, (4, 6))
    np.testing.assert_allclose(F.gelu(x, approximate='tanh').array,
                               0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), rtol=1e-12)
    np.testing.assert_allclose(F.silu(x).array, x / (1 + np.exp(-x)), rtol=1e-12)
    g, b = rng.uniform(0.5, 1.5, 6), rng.uniform(-1, 1, 6)
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    np.testing.assert_allclose(F.layer_normalization(x, g, b, eps=1e-5).array,
                               (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-10)
    np.testing.assert_allclose(F.rms_normalization(x, g).array,
                               x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + 1e-6) * g, rtol=1e-10)
    q, k, v = rng.uniform(-1, 1, (2, 3, 4, 8)), rng.uniform(-1, 1, (2, 3, 6, 8)), rng.uniform(-1, 1, (2, 3, 6, 5))
    mask = rng.uniform(0, 1, (4, 6)) > 0.3
    mask[:, 0] = True
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8) + np.where(mask, 0, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    for path in ('auto', 'composed'):
        np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, path=path).array, w @ v,
                                   rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.gelu(x, approximate='erf')
    with pytest.raises(ValueError, match="scaled_dot_product_attention: q's head dim 8 differs from k's 5"):
        F.scaled_dot_product_attention(q, k[..., :5], v)


def test_chainers_composed_functions(rng):
    x = rng.randn(4, 6).astype(np.float64)
    a, s = 1.6732632423543772, 1.0507009873554805
    np.testing.assert_allclose(F.selu(x).array, s * np.where(x >= 0, x, a * (np.exp(x) - 1)), rtol=1e-12)
    np.testing.assert_allclose(F.hard_sigmoid(x).array, np.clip(0.2 * x + 0.5, 0, 1), rtol=1e-12)
    np.testing.assert_allclose(F.crelu(x).array, np.concatenate([np.maximum(x, 0), np.maximum(-x, 0)], axis=1))
    np.testing.assert_allclose(F.maxout(x, 3).array, x.reshape(4, 2, 3).max(axis=2))
    t = rng.randn(4, 6)
    d = np.abs(x - t)
    huber = np.where(d <= 1.0, 0.5 * d ** 2, d - 0.5)
    np.testing.assert_allclose(F.huber_loss(x, t, 1.0).array, huber.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(F.huber_loss(x, t, 1.0, reduce='no').array, huber, rtol=1e-12)
    with pytest.raises(ValueError, match="reduce must be 'sum_along_second_axis' or 'no'"):
        F.huber_loss(x, t, 1.0, reduce='mean')
    y = F.group_normalization(rng.randn(2, 4, 3).astype(np.float32), 2, np.ones(4, np.float32), np.zeros(4, np.float32))
    g = np.asarray(y.array).reshape(2, 2, 6)
    np.testing.assert_allclose(g.mean(-1), 0, atol=1e-5)
    assert F.local_response_normalization(rng.randn(1, 7, 2, 2)).shape == (1, 7, 2, 2)
    up = F.unpooling_2d(np.arange(4.0).reshape(1, 1, 2, 2), 2, cover_all=False).array
    np.testing.assert_array_equal(up[0, 0], np.kron(np.arange(4.0).reshape(2, 2), np.ones((2, 2))))
    focal = F.sigmoid_focal_loss(x, (t > 0).astype(np.float64), reduce='mean')
    assert focal.shape == ()
    img = np.array([[[[0.0, 2.0], [4.0, 6.0]]]])
    np.testing.assert_allclose(F.resize_images(img, (3, 3)).array[0, 0], [[0, 1, 2], [2, 3, 4], [4, 5, 6]])
    with pytest.raises(ValueError, match="mode 'nearest' is not available"):
        F.resize_images(img, (3, 3), mode='nearest')
    theta = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    grid = F.spatial_transformer_grid(theta, (2, 2))
    np.testing.assert_allclose(grid.array[0], [[[-1, 1], [-1, 1]], [[-1, -1], [1, 1]]])
    np.testing.assert_allclose(F.spatial_transformer_sampler(img[:, :, :, :], grid).array, img)
    np.testing.assert_allclose(F.take(np.arange(6.0).reshape(2, 3), np.array([2, 0]), axis=1).array, [[2, 0], [5, 3]])
    # CTC of one step and one label: -log softmax(x)[label].
    scores = rng.randn(2, 3)
    logp = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    ctc = F.connectionist_temporal_classification([scores], np.array([[1], [0]], np.int32), 2, reduce='no')
    np.testing.assert_allclose(ctc.array, -logp[[0, 1], [1, 0]], rtol=1e-12)
    a = np.array([[0.0, 0.0, 2.0, 2.0]])
    b = np.array([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0]])
    np.testing.assert_allclose(F.bbox_iou(a, b).array, [[1 / 7, 1.0]])
    loc = F.bbox_to_loc(b[:1], np.array([[1.0, 0.0, 3.0, 8.0]]))
    np.testing.assert_allclose(F.loc_to_bbox(b[:1], loc).array, [[1.0, 0.0, 3.0, 8.0]], atol=1e-12)
    # RoI Align of a 1x1 box into one bin with one sample, at (0.5, 0.5): the mean of the 4 pixels.
    pooled = F.roi_average_align_2d(img, np.array([[0.0, 0.0, 1.0, 1.0]]), np.array([0], np.int32), 1, 1.0,
                                    sampling_ratio=1)
    np.testing.assert_allclose(pooled.array.reshape(-1), [3.0])
    assert F.roi_average_align_2d(rng.randn(2, 3, 5, 5), np.array([[0.0, 0.0, 4.0, 4.0]] * 3),
                                  np.array([1, 0, 1], np.int32), (2, 2), 1.0).shape == (3, 3, 2, 2)
    # RoI average pooling of the whole 2x2 image into one bin: the mean of its 4 pixels.
    mean = F.roi_average_pooling_2d(img, np.array([[0.0, 0.0, 2.0, 2.0]]), np.array([0], np.int32), 1, 1.0)
    np.testing.assert_allclose(mean.array.reshape(-1), [3.0])
    # The max variants of the same bins: the largest pixel, or the largest bilinear sample.
    peak = F.roi_max_pooling_2d(img, np.array([[0.0, 0.0, 2.0, 2.0]]), np.array([0], np.int32), 1, 1.0)
    np.testing.assert_allclose(peak.array.reshape(-1), [img.max()])
    rows = np.array([[0.0, 0.0, 0.0, 1.0, 1.0]])  # (image, x_min, y_min, x_max, y_max), corners included
    np.testing.assert_allclose(F.roi_pooling_2d(img, rows, 1, 1, 1.0).array.reshape(-1), [img.max()])
    sampled = F.roi_max_align_2d(img, np.array([[0.0, 0.0, 1.0, 1.0]]), np.array([0], np.int32), 1, 1.0,
                                 sampling_ratio=1)
    np.testing.assert_allclose(sampled.array.reshape(-1), [3.0])
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], np.float32)
    kept = F.non_maximum_suppression(boxes, 0.5, score=np.array([0.2, 0.9, 0.5], np.float32))
    assert np.asarray(kept).tolist() == [1, 2]
    assert np.asarray(F.non_maximum_suppression(boxes, 0.5, label=np.array([0, 1, 0], np.int32))).tolist() == [0, 1, 2]



def test_n_step_rnns_take_chainers_arguments():
    # The example of Chainer's n_step_lstm and n_step_bilstm documentation: three sequences of
    # lengths 3, 2 and 1, time-major, two layers of two units.
    batchs, in_size, out_size, n_layers = [3, 2, 1], 3, 2, 2
    xs = [np.ones((b, in_size), np.float32) for b in batchs]
    for bi in (False, True):
        dirs = 2 if bi else 1
        hx = np.ones((n_layers * dirs, batchs[0], out_size), np.float32)

        def w_in(i, j, per):
            if i < dirs and j < per // 2:
                return in_size
            return out_size * dirs if j < per // 2 else out_size

        for name, per in (('lstm', 8), ('gru', 6), ('rnn', 2)):
            ws = [[np.ones((out_size, w_in(i, j, per)), np.float32) for j in range(per)] for i in range(n_layers * dirs)]
            bs = [[np.ones((out_size,), np.float32) for _ in range(per)] for _ in range(n_layers * dirs)]
            fn = getattr(F, 'n_step_bi' + name if bi else 'n_step_' + name)
            out = fn(n_layers, 0.0, hx, hx, ws, bs, xs) if name == 'lstm' else fn(n_layers, 0.0, hx, ws, bs, xs)
            assert out[0].shape == (n_layers * dirs, 3, out_size)
            assert [y.shape for y in out[-1]] == [(b, out_size * dirs) for b in batchs]
    with pytest.raises(ValueError, match='n_step_lstm: ws\\[0\\] and bs\\[0\\] must hold 8 arrays each'):
        F.n_step_lstm(1, 0.0, hx[:1], hx[:1], [[]], [[]], xs)
