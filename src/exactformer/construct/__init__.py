"""Constructions of exactly interpolating transformers: docs/hardmax.md, softmax.md, causal.md."""
