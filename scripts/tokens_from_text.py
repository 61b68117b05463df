#!/usr/bin/env python3
"""Writes a text's bytes as an llm.c token file, for axon's "tokens" data set.

Each byte becomes one uint16 token (vocab 256, so train with
--data-config train=OUT,vocab=256). The file is llm.c's format: a header
of 256 little-endian int32 (magic 20240520, version 1, the token count,
zeros), then the tokens as little-endian uint16.

  scripts/tokens_from_text.py INPUT OUT.bin [--max-bytes N]
                              [--val FRAC --val-out VAL.bin]

INPUT may be gzip-compressed (a dictd .dz is). With --val the last FRAC of
the bytes go to VAL.bin instead of OUT.bin (then pass val=VAL.bin).
Standard library only."""
import argparse
import gzip
import struct
import sys
from array import array

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256


def write_tokens(path, tokens):
    """Writes tokens (bytes, or ints in [0, 65536)) to path in llm.c's
    format."""
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    if isinstance(tokens, (bytes, bytearray)):
        body = bytearray(2 * len(tokens))  # each byte, then a zero byte
        body[0::2] = tokens
    else:
        words = array("H", tokens)
        if sys.byteorder != "little":
            words.byteswap()
        body = words.tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        f.write(body)


def read_bytes(path, max_bytes):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    with opener(path, "rb") as f:
        return f.read(max_bytes) if max_bytes > 0 else f.read()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input")
    p.add_argument("out")
    p.add_argument("--max-bytes", type=int, default=0,
                   help="read at most N (decompressed) bytes (0: all)")
    p.add_argument("--val", type=float, default=0.0,
                   help="the tail fraction written to --val-out")
    p.add_argument("--val-out", help="the validation file")
    a = p.parse_args()
    if (a.val > 0) != bool(a.val_out) or not 0 <= a.val < 1:
        p.error("--val FRAC in (0, 1) and --val-out go together")
    data = read_bytes(a.input, a.max_bytes)
    cut = len(data) - int(a.val * len(data))
    if cut <= 0 or (a.val_out and cut == len(data)):
        p.error("%s: too few bytes (%d)" % (a.input, len(data)))
    write_tokens(a.out, data[:cut])
    if a.val_out:
        write_tokens(a.val_out, data[cut:])
    print("%s: %d tokens%s" % (a.out, cut, ", %s: %d tokens" %
                               (a.val_out, len(data) - cut)
                               if a.val_out else ""))


if __name__ == "__main__":
    main()
