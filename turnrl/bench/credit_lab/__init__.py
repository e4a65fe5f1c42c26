"""The credit lab: every credit method's gradient estimate against the exact policy gradient on small
MDPs (``mdp``, ``exact``), over sweeps of batch sizes and seeds (``lab``), reported with plots
(``report``): ``python -m turnrl credit-lab``."""
