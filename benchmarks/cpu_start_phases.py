"""A warm start's phases in one process, as one JSON line: importing
jaxinfer, ``LLM()`` on the embedded model, and its first greedy token (the
step programs loaded from the persistent cache), plus which heavy modules
the process ended up importing.

    python benchmarks/cpu_start_phases.py

To compare two trees, run it alternately against each, e.g. commit cf9bcc0
with ml_dtypes 0.7.0 (installed into /tmp/mld_0.7.0 with ``pip install
--no-deps --target``, the old package unpacked into /tmp/oldtree with ``git
archive cf9bcc0 jaxinfer``)::

    for i in 1 2 3; do python benchmarks/cpu_start_phases.py
      PYTHONPATH=/tmp/mld_0.7.0:/tmp/oldtree python benchmarks/cpu_start_phases.py; done
"""

import time

t0 = time.perf_counter()
from jaxinfer import LLM, SamplingParams

t1 = time.perf_counter()
llm = LLM()
t2 = time.perf_counter()
llm.generate(["The capital of France is"],
             SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
t3 = time.perf_counter()

import json
import sys

import ml_dtypes

import jaxinfer

print(json.dumps({
    "jaxinfer": jaxinfer.__file__, "ml_dtypes": ml_dtypes.__version__,
    "imported": sorted(m for m in ("transformers", "torch", "fastapi")
                       if m in sys.modules),
    "import_s": round(t1 - t0, 2), "llm_s": round(t2 - t1, 2),
    "first_token_s": round(t3 - t2, 2), "total_s": round(t3 - t0, 2)}))
