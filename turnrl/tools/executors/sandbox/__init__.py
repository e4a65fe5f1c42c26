"""The bubblewrap sandbox for model-written code: the executor, its warm pool and launcher,
seccomp and cgroup limits, and the verdict of a run."""
