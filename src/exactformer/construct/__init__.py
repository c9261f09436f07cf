"""Constructions of exactly interpolating transformers (DESIGN §4 and §5)."""
