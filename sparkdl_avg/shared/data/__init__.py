"""Staged data, as both sides see it: the staged dataset's format, its columns and their kinds (one registry), exact value conversions, the example order, preprocessing, value checks."""
