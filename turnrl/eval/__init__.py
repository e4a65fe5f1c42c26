"""Evaluating a checkpoint (``python -m turnrl eval``): ``run`` (episodes on a split), ``metrics`` (pass@k,
intervals) and ``report`` (the JSON and table it writes)."""
