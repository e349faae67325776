"""Staged data, as both sides see it: the staged dataset's format, its columns, the example order, preprocessing, value checks."""
