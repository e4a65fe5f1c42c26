"""The docker executor: code runs in a container of a locally built image (``image``)."""
