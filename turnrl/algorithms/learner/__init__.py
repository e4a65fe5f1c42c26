"""The learner: ``Learner.update`` (``learner``) on scored tokens (``scoring``, ``chunked_head``,
``shared_prompt``), the critic (``critic``) and the update's metrics (``tally``)."""
