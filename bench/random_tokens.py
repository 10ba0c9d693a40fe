#!/usr/bin/env python3
"""bench/random_tokens.py FILE N: an llm.c token file of N random uint16 tokens (a 256 x int32
header: magic 20240520, version 1, count), for benchmarks whose cost does not depend on the text."""
import os
import struct
import sys

path, n = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(os.urandom(2 * n))
