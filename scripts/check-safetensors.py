#!/usr/bin/env python3
"""Compare a GPT-2 safetensors export with an llm.c model file, tensor by tensor.

Usage: check-safetensors.py MODEL.safetensors|FOLDER MODEL.bin

A FOLDER holds Hugging Face's sharded form: `model.safetensors.index.json` and its shards.
Each shard is read with the package, every tensor must sit in the shard the index names,
and the index's total_size must be the tensors' bytes.

The safetensors file is read with Hugging Face's own `safetensors` package (numpy backend),
so this checks the export against the reference reader, not against zero-train's code. The
llm.c file is parsed here with numpy: a header of 256 int32 (magic 20240326, version 3, maxT,
V, L, NH, C, Vp), then the sixteen float32 tensors in llm.c's order. HF's Conv1D weights are
llm.c's transposed; wte has V rows in HF's file and Vp in llm.c's. F32 files must match
bit for bit; BF16 files must equal llm.c's values rounded to bfloat16 (nearest even).
Exit status 0 when every tensor matches, 1 otherwise.
"""

import json
import os
import sys

import numpy as np
from safetensors import deserialize
from safetensors.numpy import load_file

BLOCK = [  # (HF name, llm.c name, transposed, per-layer shape as a function of C)
    ("ln_1.weight", "ln1w", False, lambda c: (c,)),
    ("ln_1.bias", "ln1b", False, lambda c: (c,)),
    ("attn.c_attn.weight", "qkvw", True, lambda c: (3 * c, c)),
    ("attn.c_attn.bias", "qkvb", False, lambda c: (3 * c,)),
    ("attn.c_proj.weight", "attprojw", True, lambda c: (c, c)),
    ("attn.c_proj.bias", "attprojb", False, lambda c: (c,)),
    ("ln_2.weight", "ln2w", False, lambda c: (c,)),
    ("ln_2.bias", "ln2b", False, lambda c: (c,)),
    ("mlp.c_fc.weight", "fcw", True, lambda c: (4 * c, c)),
    ("mlp.c_fc.bias", "fcb", False, lambda c: (4 * c,)),
    ("mlp.c_proj.weight", "fcprojw", True, lambda c: (c, 4 * c)),
    ("mlp.c_proj.bias", "fcprojb", False, lambda c: (c,)),
]


def read_llmc(path):
    raw = np.fromfile(path, dtype="<i4", count=256)
    if raw[0] != 20240326 or raw[1] != 3:
        sys.exit(f"{path}: not an llm.c float32 model (magic {raw[0]}, version {raw[1]})")
    max_t, vocab, layers, heads, c, vp = (int(x) for x in raw[2:8])
    flat = np.fromfile(path, dtype="<f4", offset=1024)
    shapes = [("wte", (vp, c)), ("wpe", (max_t, c))]
    shapes += [(name, (layers,) + shape(c)) for _, name, _, shape in BLOCK]
    shapes += [("lnfw", (c,)), ("lnfb", (c,))]
    out, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out[name] = flat[at : at + n].reshape(shape)
        at += n
    if at != flat.size:
        sys.exit(f"{path}: {flat.size} floats, the header implies {at}")
    return out, (max_t, vocab, layers, heads, c)


def bf16_round(x):
    """float32 -> the float32 value of its bfloat16 rounding (nearest even; finite inputs)."""
    u = x.astype("<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype("<u4").view("<f4")


def load_safetensors(path):
    """name -> float32 array, and whether the file held bfloat16.

    numpy has no bfloat16, so `load_file` refuses BF16 files; those go through the
    package's own parser (`deserialize`) and are widened here (bf16 is float32's top half).
    """
    try:
        return load_file(path), False
    except TypeError:
        out = {}
        with open(path, "rb") as f:
            for name, t in deserialize(f.read()):
                if t["dtype"] != "BF16":
                    sys.exit(f"{path}: tensor {name} is {t['dtype']}, expected F32 or BF16")
                wide = np.frombuffer(bytes(t["data"]), dtype="<u2").astype("<u4") << 16
                out[name] = wide.view("<f4").reshape(t["shape"])
        return out, True


def load_sharded(folder):
    """As load_safetensors, over the shards an index names, checking the index."""
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    out, bf16, size = {}, False, 0
    for shard in sorted(set(weight_map.values())):
        tensors, bf16 = load_safetensors(os.path.join(folder, shard))
        for name, t in tensors.items():
            if weight_map.get(name) != shard:
                sys.exit(f"{shard}: holds {name}, which the index maps to {weight_map.get(name)}")
            size += t.size * (2 if bf16 else 4)
        out.update(tensors)
    if set(out) != set(weight_map):
        sys.exit(f"{folder}: the index maps tensors no shard holds")
    if index["metadata"]["total_size"] != size:
        sys.exit(f"{folder}: total_size {index['metadata']['total_size']}, tensors hold {size}")
    return out, bf16


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    st_path, bin_path = sys.argv[1:]
    loader = load_sharded if os.path.isdir(st_path) else load_safetensors
    tensors, bf16 = loader(st_path)
    st = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    llmc, (max_t, vocab, layers, _, c) = read_llmc(bin_path)
    want = {
        "wte.weight": llmc["wte"][:vocab],
        "wpe.weight": llmc["wpe"],
        "ln_f.weight": llmc["lnfw"],
        "ln_f.bias": llmc["lnfb"],
    }
    for layer in range(layers):
        for hf, name, transposed, _ in BLOCK:
            t = llmc[name][layer]
            want[f"h.{layer}.{hf}"] = t.T if transposed else t
    bad = 0
    extra = sorted(set(st) - set(want))
    for name in extra:
        print(f"unexpected tensor {name}")
        bad += 1
    for name, ref in want.items():
        got = st.get(name)
        if got is None:
            print(f"missing tensor {name}")
            bad += 1
            continue
        if got.shape != ref.shape:
            print(f"{name}: shape {got.shape}, llm.c gives {ref.shape}")
            bad += 1
            continue
        ref = bf16_round(ref) if bf16 else np.ascontiguousarray(ref)
        same = np.array_equal(got.view("<u4"), ref.view("<u4"))
        if not same:
            print(f"{name}: values differ")
            bad += 1
    print(f"{len(want)} tensors compared, {bad} mismatches "
          f"(L={layers}, C={c}, V={vocab}, maxT={max_t})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
