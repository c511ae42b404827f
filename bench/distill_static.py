"""Distil the static embedder's token table from all-MiniLM-L6-v2 (run once, at development time).

model2vec's method (Tulkens & van Dongen, 2024): every vocabulary token goes through the model
alone (``[CLS] token [SEP]``, mean-pooled), the 384-d outputs are reduced by PCA, and each row is
weighted by a Zipf/SIF weight ``sif / (sif + p(rank))`` so frequent tokens count less in a mean
(sif 1e-5 ranked paraphrases best of 1e-3..1e-6 in bench/embed_choice.py; 256 dims matched 384).
BERT's vocabulary is roughly frequency-ordered after its special and single-character entries, so
the id stands for the rank, as model2vec does.

The table is stored int8 with one float16 scale per row, compressed, in
``src/ctxwarden/data/embed/minilm-l6-static.npz`` (read by ``ctxwarden.embed.StaticEmbedder``).

    uv run python bench/distill_static.py [--dims 256] [--sif 1e-4] [--out PATH] [--tokens N]

``--tokens N`` distils only the first N vocabulary ids (a quick run, not a table to ship).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctxwarden.embed import MiniLMEmbedder, _load_tokenizer

OUT = Path(__file__).resolve().parent.parent / "src/ctxwarden/data/embed/minilm-l6-static.npz"


def token_outputs(batch: int = 512, limit: int | None = None) -> np.ndarray:
    """Mean-pooled MiniLM output of ``[CLS] t [SEP]`` for every vocabulary id ``t`` (the first
    ``limit`` ids if given)."""
    tokenizer = _load_tokenizer()
    size = tokenizer.get_vocab_size()
    if limit is not None:
        size = min(size, limit)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    embedder = MiniLMEmbedder(threads=2)
    _, session = embedder._load()
    out = np.zeros((size, 384), dtype=np.float32)
    for start in range(0, size, batch):
        ids = np.arange(start, min(start + batch, size), dtype=np.int64)
        input_ids = np.stack([np.full_like(ids, cls_id), ids, np.full_like(ids, sep_id)], axis=1)
        mask = np.ones_like(input_ids)
        (hidden,) = session.run(
            ["last_hidden_state"],
            {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)},
        )
        out[start : start + len(ids)] = hidden.mean(axis=1)
    return out


def post_process(raw: np.ndarray, dims: int, sif: float) -> np.ndarray:
    """PCA to ``dims`` (centred, no whitening), then Zipf/SIF weights by rank."""
    centred = raw - raw.mean(axis=0, keepdims=True)
    # Eigen-decomposition of the 384x384 covariance: cheaper than an SVD of the whole table.
    cov = centred.T @ centred / len(centred)
    values, vectors = np.linalg.eigh(cov)
    top = vectors[:, np.argsort(values)[::-1][:dims]]
    reduced = centred @ top
    inv_rank = 1.0 / np.arange(2, len(reduced) + 2)
    proba = inv_rank / inv_rank.sum()
    weights = sif / (sif + proba)
    return (reduced * weights[:, None]).astype(np.float32)


def quantise(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows with one float16 scale each (max-abs)."""
    scales = np.abs(table).max(axis=1) / 127.0
    scales = np.where(scales == 0, 1.0, scales).astype(np.float16)
    quantised = np.clip(np.round(table / scales.astype(np.float32)[:, None]), -127, 127)
    return quantised.astype(np.int8), scales


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--sif", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--raw-cache", type=Path, default=None, help="reuse/save raw outputs")
    parser.add_argument("--tokens", type=int, default=None, help="only the first N ids")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.raw_cache is not None and args.raw_cache.exists():
        raw = np.load(args.raw_cache)
    else:
        raw = token_outputs(limit=args.tokens)
        if args.raw_cache is not None:
            np.save(args.raw_cache, raw)
    print(f"token outputs: {raw.shape} in {time.perf_counter() - started:.1f}s")
    table = post_process(raw, args.dims, args.sif)
    vectors, scales = quantise(table)
    np.savez_compressed(args.out, vectors=vectors, scales=scales)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB, {vectors.shape})")


if __name__ == "__main__":
    main()
