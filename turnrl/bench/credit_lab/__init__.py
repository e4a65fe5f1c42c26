"""The credit lab: every credit method's gradient estimate against the exact policy gradient on small
MDPs (``mdp``, ``exact``), over sweeps of settings (``lab``), summarised as bias (angle, scale),
variance, error and tests (``stats``), reported with tables and plots (``report``), and turned
into the sentences the docs cite (``claims``): ``python -m turnrl credit-lab``."""
