"""Stages before RL: supervised fine-tuning on expert episodes (``sft``), DPO (``dpo``) and a
Bradley-Terry reward model (``reward_model``)."""
