"""Transformers from Python: the normalization links, multi-head attention with a KV cache,
the pre-norm block, GPT (its GPT-2 parameter names and count, a training step that lowers the
loss, generation) and per-parameter weight decay."""

import json

import numpy as np
import pytest

import kusari
import kusari.functions as F
import kusari.links as L


def test_layer_normalization_normalizes_the_last_axis(rng):
    ln = L.LayerNormalization(8)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32) * 4 + 2
    y = np.asarray(ln(x).array)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1, atol=1e-3)
    assert sorted(n for n, _ in ln.namedparams()) == ['/beta', '/gamma']
    rms = L.RMSNormalization(8)
    z = np.asarray(rms(x).array)
    np.testing.assert_allclose((z ** 2).mean(-1), 1, atol=1e-3)
    assert rms.gamma.shape == (8,)


def test_attention_with_a_kv_cache_equals_the_full_forward(rng):
    attn = L.MultiHeadAttention(16, 4, causal=True)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    with kusari.no_backprop_mode():
        full = np.asarray(attn(x).array)
        cache = L.KVCache()
        steps = [np.asarray(attn(x[:, i:i + 1], cache=cache).array) for i in range(6)]
    assert cache.length == 6
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-5)
    names = sorted(n for n, _ in attn.namedparams())
    assert names == ['/c_attn/W', '/c_attn/b', '/c_proj/W', '/c_proj/b']


def test_cross_attention_and_its_errors(rng):
    attn = L.MultiHeadAttention(8, 2, kv_size=6)
    y = attn(rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((2, 5, 6)).astype(np.float32))
    assert y.shape == (2, 3, 8)
    with pytest.raises(ValueError, match='KV cache is for self-attention'):
        attn(np.zeros((2, 3, 8), np.float32), np.zeros((2, 5, 6), np.float32), cache=L.KVCache())
    with pytest.raises(Exception, match='head'):
        L.MultiHeadAttention(10, 3)


def test_transformer_block_has_gpt2s_children(rng):
    block = L.TransformerBlock(16, 2)
    y = block(rng.standard_normal((1, 4, 16)).astype(np.float32))
    assert y.shape == (1, 4, 16)
    names = sorted(n for n, _ in block.namedparams())
    assert '/attn/c_attn/W' in names and '/mlp/c_fc/W' in names and '/ln_2/gamma' in names
    assert block.c_fc.W.shape == (64, 16)


def test_gpt2_small_has_124m_parameters():
    config = kusari.models.gpt2_small_config()
    assert (config.n_layer, config.n_head, config.n_embd, config.vocab_size) == (12, 12, 768, 50257)
    model = kusari.models.GPT(config)
    # The vocabulary padded to 50,304 rows (Note [Padded vocabulary]); unpadded, GPT-2's count.
    assert (config.vocab_multiple, model.padded_vocab_size) == (64, 50304)
    assert model.count_params() == 124439808 + 47 * 768
    config.vocab_multiple = 1
    assert kusari.models.GPT(config).count_params() == 124439808
    names = [n for n, _ in model.namedparams()]
    assert '/wte/W' in names and '/h/11/attn/c_proj/b' in names and '/ln_f/beta' in names


def test_gpt_trains_and_generates(rng):
    config = kusari.models.GPTConfig(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=32)
    model = kusari.models.GPT(config)
    opt = kusari.optimizers.AdamW(alpha=3e-3, weight_decay_rate=3e-4)
    opt.setup(model)
    opt.set_hyperparam_where('weight_decay_rate', 0.0, kusari.optimizers.is_bias_or_norm)
    # A sequence that repeats 0 1 2 ... 7: learnable from the previous token alone.
    ids = np.tile(np.arange(8, dtype=np.int32), 4)[None, :17].repeat(4, axis=0)
    x, t = ids[:, :-1], ids[:, 1:]
    losses = []
    for _ in range(30):
        opt.update(model, x, t)
        losses.append(float(np.asarray(model(x, t).array)))
    assert losses[-1] < 0.5 * losses[0], losses
    logits = model(x)
    assert logits.shape == (4, 16, 16)
    out = np.asarray(model.generate(np.array([[0, 1, 2]], np.int64), 5, temperature=0.0))
    assert out.shape == (1, 8)
    np.testing.assert_array_equal(out[0, :3], [0, 1, 2])
    np.testing.assert_array_equal(out[0, 3:], [3, 4, 5, 6, 7])
    with pytest.raises(ValueError, match="reads 'alpha' once"):
        opt.set_hyperparam_where('alpha', 0.0, kusari.optimizers.is_bias_or_norm)


def test_weight_decay_spares_what_the_selector_picks():
    model = kusari.Sequential(L.Linear(2, 2))
    opt = kusari.optimizers.AdamW(alpha=1e-3, eta=0.5, weight_decay_rate=0.1)
    opt.setup(model)
    opt.set_hyperparam_where('weight_decay_rate', 0.0, lambda path, p: path.endswith('/b'))
    W0 = np.asarray(model[0].W.array).copy()
    model[0].b.array[...] = 1.0
    model[0].W.grad = np.zeros_like(W0)
    model[0].b.grad = np.zeros(2, np.float32)
    opt.update()
    np.testing.assert_allclose(np.asarray(model[0].W.array), W0 * 0.95, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(model[0].b.array), [1.0, 1.0])


def test_scaled_dot_product_attention_is_causal(rng):
    q = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    y = np.asarray(F.scaled_dot_product_attention(q, k, v, is_causal=True).array)
    # The first query sees only the first key: its output is the first value.
    np.testing.assert_allclose(y[:, :, 0], v[:, :, 0], rtol=1e-5)


def _write_safetensors(path, tensors, dtype='F32'):
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        if dtype == 'BF16':
            raw = (np.ascontiguousarray(value, np.float32).view(np.uint32) >> 16).astype('<u2').tobytes()
        else:
            raw = np.ascontiguousarray(value, '<f4').tobytes()
        header[name] = {'dtype': dtype, 'shape': list(value.shape), 'data_offsets': [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, 'wb') as f:
        f.write(len(text).to_bytes(8, 'little') + text + b''.join(blobs))


def _gpt2_numpy(t, ids, n_head):
    """GPT-2's forward in NumPy on the checkpoint's own layout (Conv1D: x @ W + b)."""
    def ln(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-5) * t[p + '.weight'] + t[p + '.bias']

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    T = ids.shape[1]
    x = t['wte.weight'][ids] + t['wpe.weight'][:T]
    layers = len({k.split('.')[1] for k in t if k.startswith('h.')})
    for i in range(layers):
        h = 'h.%d.' % i
        qkv = ln(x, h + 'ln_1') @ t[h + 'attn.c_attn.weight'] + t[h + 'attn.c_attn.bias']
        q, k, v = np.split(qkv, 3, axis=-1)
        B, C = x.shape[0], x.shape[-1]
        split = lambda z: z.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(C // n_head)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        y = (w @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ t[h + 'attn.c_proj.weight'] + t[h + 'attn.c_proj.bias']
        m = gelu(ln(x, h + 'ln_2') @ t[h + 'mlp.c_fc.weight'] + t[h + 'mlp.c_fc.bias'])
        x = x + m @ t[h + 'mlp.c_proj.weight'] + t[h + 'mlp.c_proj.bias']
    return ln(x, 'ln_f') @ t['wte.weight'].T


def test_a_gpt2_checkpoint_loads_and_computes_gpt2s_logits(rng, tmp_path):
    from kusari import gpt2
    V, P, C, L_ = 40, 16, 24, 2
    t = {'wte.weight': rng.standard_normal((V, C)) * 0.1, 'wpe.weight': rng.standard_normal((P, C)) * 0.1,
         'ln_f.weight': 1 + 0.1 * rng.standard_normal(C), 'ln_f.bias': 0.1 * rng.standard_normal(C)}
    for i in range(L_):
        h = 'h.%d.' % i
        for name, shape in [('ln_1.weight', (C,)), ('ln_1.bias', (C,)), ('ln_2.weight', (C,)), ('ln_2.bias', (C,)),
                            ('attn.c_attn.weight', (C, 3 * C)), ('attn.c_attn.bias', (3 * C,)),
                            ('attn.c_proj.weight', (C, C)), ('attn.c_proj.bias', (C,)),
                            ('mlp.c_fc.weight', (C, 4 * C)), ('mlp.c_fc.bias', (4 * C,)),
                            ('mlp.c_proj.weight', (4 * C, C)), ('mlp.c_proj.bias', (C,))]:
            t[h + name] = (1.0 if name.startswith('ln') and name.endswith('weight') else 0.0) + \
                0.1 * rng.standard_normal(shape)
    t = {k: v.astype(np.float32) for k, v in t.items()}
    with_buffers = {('transformer.' + k): v for k, v in t.items()}
    with_buffers['transformer.h.0.attn.bias'] = np.tril(np.ones((1, 1, P, P), np.float32))
    with_buffers['lm_head.weight'] = t['wte.weight']
    path = str(tmp_path / 'model.safetensors')
    _write_safetensors(path, with_buffers)
    config = gpt2.config_of(gpt2.read_safetensors(path))
    config.n_head = 4  # (24 features: not one of GPT-2's sizes, so its head count is given)
    model = gpt2.load_gpt2(path, config)
    # wte is padded from 40 rows to 64 with zeros (Note [Padded vocabulary]).
    wte = np.asarray(model.wte.W.array)
    assert wte.shape == (64, C) and not wte[V:].any()
    np.testing.assert_array_equal(wte[:V], t['wte.weight'])
    ids = rng.randint(0, V, size=(2, 10))
    with kusari.no_backprop_mode():
        ours = np.asarray(model(ids.astype(np.int32)).array)
    np.testing.assert_allclose(ours, _gpt2_numpy(t, ids, 4), rtol=2e-4, atol=2e-5)
    # The .npz of the command line, read back into a fresh model.
    out = str(tmp_path / 'gpt2.npz')
    _write_safetensors(path, t)
    assert gpt2.main([path, out]) == 0
    model2 = kusari.models.GPT(config)
    kusari.serializers.load_npz(out, model2)
    with kusari.no_backprop_mode():
        np.testing.assert_array_equal(np.asarray(model2(ids.astype(np.int32)).array), ours)
    # bfloat16 files are read too; a misshapen or missing tensor is named.
    _write_safetensors(path, t, 'BF16')
    assert gpt2.read_safetensors(path)['wte.weight'].dtype == np.float32
    bad = dict(t)
    bad['h.1.mlp.c_fc.weight'] = bad['h.1.mlp.c_fc.weight'][:, :-1]
    with pytest.raises(ValueError, match=r"'h.1.mlp.c_fc.weight' has shape \(95, 24\) \(transposed\)"):
        gpt2.load_gpt2(bad, config)
    del bad['h.1.mlp.c_fc.weight']
    with pytest.raises(ValueError, match='lacks 1 of the model'):
        gpt2.load_gpt2(bad, config)
