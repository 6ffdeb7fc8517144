"""Runs another benchmark script with the Mosaic int4 kernel's default
tuning replaced (measurement only: a tuning's effect on the whole decode
step before it becomes the default). GPU machine, repo root:

    PYTHONPATH=. python3 benchmarks/kernels/with_int4_tuning.py \\
        'overlap=True' benchmarks/quant_step.py --out $OUT ...
"""

from __future__ import annotations

import ast
import runpy
import sys


def main() -> None:
    fields = dict((k, ast.literal_eval(v)) for k, v in
                  (kv.split("=", 1) for kv in sys.argv[1].split(",") if kv))
    import dataclasses

    from jaxinfer.pallas_kernels import int4_matmul_mgpu as m
    cls = m.Int4MosaicTuning
    # The dataclass's own defaults (every Int4MosaicTuning() made from now
    # on), and the default arguments already bound to an instance.
    cls.__init__.__defaults__ = tuple(
        fields.get(f.name, f.default) for f in dataclasses.fields(cls))
    tuned = cls()
    for fn in (m.int4_matmul_mgpu, m.int4_matmul_mgpu_many):
        fn.__kwdefaults__["tuning"] = tuned
    print(f"int4 Mosaic default tuning: {tuned}", flush=True)
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
