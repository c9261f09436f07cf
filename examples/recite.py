"""A causal transformer that recites a text: built, not trained, and exact at every character.

The characters of a public-domain passage (the opening of Jane Austen's *Pride and Prejudice*,
1813) become fixed vectors in R^8 (deterministic small integers); the causal dataset asks, at
every position, for the next character. A single text needs no separation round (R_c = 0): the
construction gives every position a key in coordinates of the model's own and moves each
position's state onto its target with one ReLU unit (position keys, docs/causal.md), width units
to a layer. The model then generates the whole passage back from its first character, feeding
each output, snapped to the nearest character vector, back in as the next input.

Second part: several texts that share an opening after a distinct first character. Positions
alone no longer tell the contexts apart (the same character at the same position continues
differently), so separation rounds split them by their prefixes; each text is generated back
from its first character.

``--file TEXT`` recites any UTF-8 text instead of the passage (all of it, or its first
``--chars`` characters); ``--width`` puts width key units (or, for the shared openings, width/4
hats) in one FF layer (docs/causal.md), which is what makes a book of 10^6 characters a model of
245 blocks at width 4096 (benchmarks/bench_book.py).

Run: .venv/bin/python examples/recite.py [--chars 2000] [--exact] [--file TEXT] [--width 4]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import exactformer as ef
from exactformer.data.text import read_text, text_embedding
from exactformer.tools.decode import generate, nearest

DIM = 8

PASSAGE = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife.\n\n"
    "However little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that "
    "he is considered the rightful property of some one or other of their daughters.\n\n"
    "\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard that Netherfield "
    "Park is let at last?\"\n\n"
    "Mr. Bennet replied that he had not.\n\n"
    "\"But it is,\" returned she; \"for Mrs. Long has just been here, and she told me all "
    "about it.\"\n\n"
    "Mr. Bennet made no answer.\n\n"
    "\"Do you not want to know who has taken it?\" cried his wife impatiently.\n\n"
    "\"You want to tell me, and I have no objection to hearing it.\"\n\n"
    "This was invitation enough.\n\n"
    "\"Why, my dear, you must know, Mrs. Long says that Netherfield is taken by a young man of "
    "large fortune from the north of England; that he came down on Monday in a chaise and four "
    "to see the place, and was so much delighted with it, that he agreed with Mr. Morris "
    "immediately; that he is to take possession before Michaelmas, and some of his servants "
    "are to be in the house by the end of next week.\"\n\n"
    "\"What is his name?\"\n\n"
    "\"Bingley.\"\n\n"
    "\"Is he married or single?\"\n\n"
    "\"Oh! Single, my dear, to be sure! A single man of large fortune; four or five thousand a "
    "year. What a fine thing for our girls!\"\n\n"
    "\"How so? How can it affect them?\"\n\n"
    "\"My dear Mr. Bennet,\" replied his wife, \"how can you be so tiresome! You must know that "
    "I am thinking of his marrying one of them.\"\n\n"
    "\"Is that his design in settling here?\"\n\n"
    "\"Design! Nonsense, how can you talk so! But it is very likely that he may fall in love "
    "with one of them, and therefore you must visit him as soon as he comes.\"\n\n"
    "\"I see no occasion for that. You and the girls may go, or you may send them by "
    "themselves, which perhaps will be still better, for as you are as handsome as any of "
    "them, Mr. Bingley may like you the best of the party.\"\n\n"
    "\"My dear, you flatter me. I certainly have had my share of beauty, but I do not pretend "
    "to be any thing extraordinary now.\"\n"
)

SHARED = [  # a distinct first character, then a common opening, then different continuations
    "1\"My dear Mr. Bennet,\" said his lady to him one day, \"have you heard?\"",
    "2\"My dear Mr. Bennet,\" replied his wife, \"how can you be so tiresome!\"",
    "3\"My dear Mr. Bennet,\" said she, \"Netherfield is let at last.\"",
]


def alphabet_vectors(texts: list[str], d: int = DIM, seed: int = 0) -> tuple[str, np.ndarray]:
    """The texts' distinct characters (sorted) and their vectors (``text_embedding``)."""
    embedding = text_embedding(texts, d, seed)
    return "".join(embedding), np.array(list(embedding.values()))


def next_character_data(texts: list[str], alphabet: str, vocab: np.ndarray) -> ef.CausalDataset:
    """Inputs: the characters' vectors; target at position i: the vector of character i + 1
    (null at the last position)."""
    return ef.CausalDataset.from_text(texts, dict(zip(alphabet, vocab, strict=True)))


def recite(model, text: str, alphabet: str, vocab: np.ndarray) -> str:
    """The text generated back from its first character."""
    start = vocab[[alphabet.index(text[0])]]
    out = generate(model, start, len(text) - 1, vocabulary=vocab)
    return text[0] + "".join(alphabet[nearest(vocab, np.asarray(r, dtype=float))] for r in out)


def build_and_recite(texts: list[str], exact: bool, label: str, width: int = 4) -> dict:
    alphabet, vocab = alphabet_vectors(texts)
    data = next_character_data(texts, alphabet, vocab)
    t0 = time.perf_counter()
    model = ef.compile(data, exact=exact, causal=True, width=width)
    t1 = time.perf_counter()
    report = ef.verify(model, data)
    t2 = time.perf_counter()
    recited = [recite(model, t, alphabet, vocab) for t in texts]
    t3 = time.perf_counter()
    row = {"label": label, "texts": len(texts), "characters": data.total_n,
           "alphabet": len(alphabet), "L": model.n_blocks, "R_c": model.record.R,
           "P": model.n_params(), "P_positions": int(np.size(model.positions)),
           "build_s": t1 - t0, "verify_s": t2 - t1, "generate_s": t3 - t2, "verified": report.ok,
           "recited": all(r == t for r, t in zip(recited, texts, strict=True))}
    print(f"{label}: {row['texts']} text(s), {row['characters']} characters, alphabet "
          f"{row['alphabet']}, d = {DIM}, {'rational' if exact else 'float64'} parameters\n"
          f"  L = {row['L']} blocks (R_c = {row['R_c']}), P = {row['P']} parameters in the "
          f"blocks + {row['P_positions']} in the stored positions\n"
          f"  build {row['build_s']:.2f} s, verify {row['verify_s']:.2f} s "
          f"({'EXACT' if exact else 'OK'} if verified: {report.ok}), "
          f"generation {row['generate_s']:.2f} s\n"
          f"  every text generated back from its first character: {row['recited']}")
    return row


def main(chars: int | None = 2000, exact: bool = False, file: str | None = None,
         width: int = 4) -> list[dict]:
    """The passage (or the file's text) and the shared openings, each built, verified and
    recited; the file's text alone when a file is given."""
    if file is not None:
        return [build_and_recite([read_text(file, chars)], exact, file, width)]
    chars = 2000 if chars is None else chars
    if not 2 <= chars <= len(PASSAGE):
        raise ValueError(f"chars must be between 2 and {len(PASSAGE)}")
    text = PASSAGE[:chars]
    rows = [build_and_recite([text], exact, "passage", width),
            build_and_recite(SHARED, exact, "shared openings", width)]
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chars", type=int, default=None,
                    help="characters of the passage (default 2000) or of the file (default all)")
    ap.add_argument("--exact", action="store_true", help="rational parameters (slower)")
    ap.add_argument("--file", help="a UTF-8 text file to recite instead of the passage")
    ap.add_argument("--width", type=int, default=4, help="widest FF layer (a multiple of 4)")
    args = ap.parse_args()
    try:
        rows = main(args.chars, args.exact, args.file, args.width)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(0 if all(r["verified"] and r["recited"] for r in rows) else 1)
