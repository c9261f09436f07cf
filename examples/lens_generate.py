"""Generate texts back through TransformerLens alone: no exactformer import, only the folder.

A folder written by ``exactformer export MODEL.json -o FOLDER --layout transformer-lens``
carries ``lens_helpers.py``; this script loads the bridge with it and regenerates each text
greedily from its first character (``lens_helpers.generate``,
docs/export.md#transformerlens-alone), with the vocabulary file ``exactformer text`` writes
(an object character -> vector). It prints whether every text came back exactly and the
characters a second.

    exactformer text book.txt -o t.json --vocabulary v.json
    exactformer build t.json -o m.json
    exactformer export m.json --layout transformer-lens -o tl
    python examples/lens_generate.py tl v.json book.txt

Several TEXT files: one causal model of several texts (each generated from its own first
character).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def main(folder: str, vocabulary: str, texts: list[str]) -> dict:
    """Boot the folder's bridge and generate every text from its first character."""
    sys.path.insert(0, folder)
    from lens_helpers import attention_free, generate, load_bridge

    start = time.perf_counter()
    bridge = load_bridge(folder)
    boot = time.perf_counter() - start
    table = json.loads(Path(vocabulary).read_text(encoding="utf-8"))
    alphabet = list(table)
    vectors = torch.tensor([table[c] for c in alphabet], dtype=torch.float64)
    start, chars, exact = time.perf_counter(), 0, True
    for text in texts:
        out = generate(bridge, vectors[[alphabet.index(text[0])]], len(text) - 1, vectors)
        exact &= text[0] + "".join(alphabet[i] for i in out) == text
        chars += len(out)
    seconds = time.perf_counter() - start
    return {"layers": bridge.cfg.n_layers, "attention_free": attention_free(bridge),
            "boot_s": boot, "chars": chars, "seconds": seconds, "exact": exact}


if __name__ == "__main__":
    sys.modules["exactformer"] = None  # this script runs on the folder alone
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("vocabulary")
    ap.add_argument("texts", nargs="+", help="UTF-8 text files, one text each")
    args = ap.parse_args()
    r = main(args.folder, args.vocabulary,
             [Path(t).read_text(encoding="utf-8") for t in args.texts])
    how = "attention-free: tabulated" if r["attention_free"] else \
        "with attention: the whole prefix a token"
    print(f"{r['layers']} layers ({how}), booted in {r['boot_s']:.1f} s; {r['chars']} "
          f"characters generated in {r['seconds']:.1f} s, "
          f"{r['chars'] / r['seconds']:.1f} characters/s, "
          f"{'every text back exactly' if r['exact'] else 'NOT the texts'}")
    sys.exit(0 if r["exact"] else 1)
