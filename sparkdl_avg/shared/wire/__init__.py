"""The round's wire formats: partial sums and their merge, compressed deltas, exchange files, standing jobs' files, local optimizer states, stats records."""
