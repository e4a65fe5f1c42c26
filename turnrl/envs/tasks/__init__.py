"""Tasks from a dataset or generator, often tool-using: arithmetic with a calculator, Python coding
run in the sandbox, multi-hop retrieval QA over a generated corpus."""
