"""GPT-2's checkpoints in kusari: a ``model.safetensors`` of GPT-2 (OpenAI's weights as Hugging
Face publishes them) read into ``kusari.models.GPT``, or written as a kusari ``.npz`` that
``train_gpt --load`` and ``serializers::load_npz`` read.

    /usr/bin/python3 -m kusari.gpt2 model.safetensors gpt2.npz

The names map one to one (docs/transformers.md, "GPT-2's checkpoint names"); GPT-2's linear
layers are ``Conv1D``, whose weight is (in, out), so those are transposed into kusari's (out, in).
The file is read with NumPy alone (a safetensors file is a little-endian header length, a JSON
header and the raw tensors), so no other package is needed.
"""

import argparse
import json
import os
import re
import sys

import numpy as np

import kusari
from kusari import models

_DTYPES = {'F32': np.float32, 'F16': np.float16, 'F64': np.float64}
# Conv1D weights, stored (in, out).
_TRANSPOSED = re.compile(r'^h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$')
# Buffers of the causal mask in some checkpoints: not parameters.
_SKIPPED = re.compile(r'^(h\.\d+\.attn\.(masked_)?bias|lm_head\.weight)$')


def read_safetensors(path):
    """The tensors of a safetensors file, {name: numpy array} (bf16 widened to float32)."""
    with open(path, 'rb') as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError('read_safetensors: %s is too short to be a safetensors file (%d bytes)' % (path, len(head)))
        n = int.from_bytes(head, 'little')
        size = os.path.getsize(path)
        if n <= 0 or 8 + n > size:
            raise ValueError('read_safetensors: %s: a header of %d bytes does not fit a file of %d bytes'
                             % (path, n, size))
        header = json.loads(f.read(n).decode('utf-8'))
        data = np.fromfile(f, dtype=np.uint8)
    out = {}
    for name, spec in header.items():
        if name == '__metadata__':
            continue
        begin, end = spec['data_offsets']
        if not 0 <= begin <= end <= data.size:
            raise ValueError('read_safetensors: %s: tensor %s lies outside the file (bytes %d to %d of %d)'
                             % (path, name, begin, end, data.size))
        raw = data[begin:end]
        if spec['dtype'] == 'BF16':
            array = (raw.view('<u2').astype(np.uint32) << 16).view(np.float32)
        elif spec['dtype'] in _DTYPES:
            array = raw.view(np.dtype(_DTYPES[spec['dtype']]).newbyteorder('<')).astype(_DTYPES[spec['dtype']])
        else:
            raise ValueError('read_safetensors: %s: tensor %s has dtype %s; expected F32, F16, BF16 or F64'
                             % (path, name, spec['dtype']))
        out[name] = array.reshape(spec['shape'])
    return out


def kusari_name(gpt2_name):
    """kusari's parameter path of a GPT-2 tensor name ('h.3.ln_1.weight' -> '/h/3/ln_1/gamma'),
    or None for a tensor that is not a parameter (mask buffers, the tied lm_head)."""
    name = gpt2_name[len('transformer.'):] if gpt2_name.startswith('transformer.') else gpt2_name
    if _SKIPPED.match(name):
        return None
    parts = name.split('.')
    leaf = parts[-1]
    owner = parts[-2] if len(parts) > 1 else ''
    if owner.startswith('ln_'):
        leaf = {'weight': 'gamma', 'bias': 'beta'}.get(leaf, leaf)
    else:
        leaf = {'weight': 'W', 'bias': 'b'}.get(leaf, leaf)
    return '/' + '/'.join(parts[:-1] + [leaf])


def config_of(tensors):
    """The GPTConfig of a GPT-2 checkpoint's tensors (layers counted, sizes read off wte/wpe)."""
    strip = {(k[len('transformer.'):] if k.startswith('transformer.') else k): v for k, v in tensors.items()}
    for needed in ('wte.weight', 'wpe.weight'):
        if needed not in strip:
            raise ValueError("gpt2: the checkpoint has no '%s'; is it a GPT-2 checkpoint?" % needed)
    vocab, n_embd = strip['wte.weight'].shape
    layers = {int(m.group(1)) for m in (re.match(r'^h\.(\d+)\.', k) for k in strip) if m}
    n_layer = max(layers) + 1 if layers else 0
    n_head = {768: 12, 1024: 16, 1280: 20, 1600: 25}.get(n_embd, max(1, n_embd // 64))
    return models.GPTConfig(vocab_size=vocab, block_size=strip['wpe.weight'].shape[0], n_layer=n_layer,
                            n_head=n_head, n_embd=n_embd)


def load_gpt2(tensors, config=None):
    """A kusari GPT holding the GPT-2 checkpoint `tensors` ({name: array}, or a safetensors path).
    Every parameter of the model must be given once, with its shape: a ValueError names what
    is missing, extra or misshapen."""
    if isinstance(tensors, (str, os.PathLike)):
        tensors = read_safetensors(tensors)
    config = config or config_of(tensors)
    model = models.GPT(config)
    params = dict(model.namedparams())
    seen = set()
    for name, value in tensors.items():
        path = kusari_name(name)
        if path is None:
            continue
        stripped = name[len('transformer.'):] if name.startswith('transformer.') else name
        if _TRANSPOSED.match(stripped):
            value = value.T
        if path not in params:
            raise ValueError("load_gpt2: the checkpoint's '%s' (kusari: %s) is not a parameter of GPT(%r)"
                             % (name, path, config))
        target = params[path]
        if path == '/wte/W' and value.shape[0] == config.vocab_size and value.shape[0] < target.shape[0]:
            # kusari's wte has the vocabulary padded to a multiple of config.vocab_multiple
            # (Note [Padded vocabulary] in src/models/gpt.cc); the padding rows are 0.
            pad = np.zeros((target.shape[0] - value.shape[0],) + tuple(value.shape[1:]), dtype=value.dtype)
            value = np.concatenate([value, pad])
        if tuple(target.shape) != tuple(value.shape):
            raise ValueError("load_gpt2: '%s' has shape %s%s; kusari's %s is %s"
                             % (name, tuple(value.shape), ' (transposed)' if _TRANSPOSED.match(stripped) else '',
                                path, tuple(target.shape)))
        target.array[...] = value.astype(np.float32)
        seen.add(path)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError('load_gpt2: the checkpoint lacks %d of the model\'s parameters, e.g. %s'
                         % (len(missing), ', '.join(missing[:4])))
    return model


def main(argv=None):
    p = argparse.ArgumentParser(prog='python3 -m kusari.gpt2',
                                description="Write a GPT-2 safetensors checkpoint as a kusari .npz (train_gpt --load)")
    p.add_argument('checkpoint', help='model.safetensors of GPT-2 (small, medium, large or xl)')
    p.add_argument('output', help='the .npz to write')
    a = p.parse_args(argv)
    if kusari.only_check_arguments('gpt2'):
        return 0
    model = load_gpt2(a.checkpoint)
    c = model.config
    kusari.serializers.save_npz(a.output, model)
    print('gpt2: %s -> %s (%d layers, %d heads, %d features, vocabulary %d, %d positions; %d parameters)'
          % (a.checkpoint, a.output, c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size, model.count_params()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
