#!/usr/bin/env python3
"""train.bin and val.bin in llm.c's token format (a header of 256 int32: magic 20240520,
version 1, count; then uint16 tokens): a repeating pattern of 37 tokens with 20% noise drawn
from a vocabulary of VOCAB, for measurements that need a small vocabulary.

    scripts/synthetic-tokens.py DIR VOCAB
"""
import random
import struct
import sys

out, vocab = sys.argv[1], int(sys.argv[2])
if not 37 <= vocab <= 65536:
    sys.exit("synthetic-tokens.py: VOCAB must be from 37 to 65536")
random.seed(5)
toks = [(i % 37) if random.random() < 0.8 else random.randrange(vocab) for i in range(200000)]
for name, part in (("val.bin", toks[:20000]), ("train.bin", toks[20000:])):
    header = [0] * 256
    header[:3] = [20240520, 1, len(part)]
    with open(f"{out}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{len(part)}H", *part))
