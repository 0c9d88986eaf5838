"""Cross-rank diagnosis: the per-rank ledger of collectives, structure checks, stuck-rank reports."""
