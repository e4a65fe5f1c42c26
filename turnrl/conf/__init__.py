"""The configuration: Hydra config groups (``agent/``, ``env/``, ``algorithm/``, ``trainer/``, ...), their
typed schema (``schema``) and the checks of a composed config that types cannot express
(``validate``)."""
