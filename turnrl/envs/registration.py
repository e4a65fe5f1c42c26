"""Gymnasium registration of the turnrl environments (idempotent): ``import turnrl`` registers
them; the table and the functions live in ``turnrl.env_ids``, which imports no env module."""

from turnrl.env_ids import ENV_ENTRY_POINTS, NAMESPACE, register_envs, registered_env_ids

__all__ = ["ENV_ENTRY_POINTS", "NAMESPACE", "register_envs", "registered_env_ids"]
