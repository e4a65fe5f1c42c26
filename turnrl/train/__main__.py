"""``python -m turnrl.train ...``: the Hydra entry point (``turnrl.train.entry``)."""

from turnrl.train.entry import main

main()
