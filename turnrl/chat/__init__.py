"""Chat: the tokenizer built in code, the model families and their templates, the chat formats, and the
renderer that turns a conversation into the exact token ids the policy samples from.

``renderer`` (``ChatRenderer``: render, extend by one turn, segments where a template rewrites
history), ``formats`` (chat formats by name, ``auto`` detection), ``families`` (real model
families' templates and tool-call formats), ``tokenizer`` (the byte-level BPE built in code)."""
