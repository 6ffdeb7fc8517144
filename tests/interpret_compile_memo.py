"""One compile per distinct thread program in jax's Mosaic GPU interpreter.

Interpreting a Mosaic GPU kernel with several warpgroups runs each
warpgroup as a thread, and jax compiles the thread's program through
``jax.jit(...).trace(...).lower().compile()`` (``thread_map._run_jaxpr``),
which skips jit's cache: in jax 0.10.2 every thread of every grid point
recompiles the same program. The Mosaic prefill test's one call compiled
one identical program 42 times, 4-5 s each (14 grid points x 3 warpgroups),
and the persistent cache cannot hold them (they carry host callbacks).

``install()`` wraps ``_run_jaxpr`` to compile each distinct program once
per process: the key is the jaxpr's text, the identities of the callbacks
inside it (the text alone does not name them) and the arguments' abstract
values. Compiled programs are the ones jax would build; only repeats are
skipped. If jax moves or changes the function, ``install`` does nothing and
the interpreter runs as it is.
"""

from __future__ import annotations

import collections
import inspect
import os
import threading

_MAX_PROGRAMS = 32
_compiled: collections.OrderedDict = collections.OrderedDict()
_building: dict = {}
_lock = threading.Lock()
stats = collections.Counter()


def _callbacks(jaxpr, out: list) -> list:
    for eqn in jaxpr.eqns:
        cb = eqn.params.get("callback")
        if cb is not None:
            out.append(cb)
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else (p,)):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    _callbacks(getattr(inner, "jaxpr", inner), out)
    return out


def _key(jaxpr, consts, args):
    import jax
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    cbs = _callbacks(inner, [])
    avals = tuple(jax.typeof(x) for x in jax.tree.leaves((consts, args)))
    return (str(jaxpr), tuple(map(id, cbs)), avals), cbs


def _eval(jaxpr, consts, *args):
    import jax
    jax.core.eval_jaxpr(jaxpr, consts, *args)


def _compile(jaxpr, consts, args):
    """What ``_run_jaxpr`` compiles (jax 0.11 names its body ``_run``)."""
    import jax
    from jax._src.pallas.mosaic.interpret import thread_map
    body = getattr(thread_map, "_run", _eval)
    return jax.jit(body, static_argnums=(0,)).trace(
        jaxpr, consts, *args).lower().compile()


def _run_jaxpr_once(jaxpr, consts, *args):
    key, cbs = _key(jaxpr, consts, args)
    with _lock:
        hit = _compiled.get(key)
        event = _building.get(key) if hit is None else None
        owner = hit is None and event is None
        if owner:
            event = _building[key] = threading.Event()
    if hit is None and not owner:
        event.wait()  # another thread builds this program
        with _lock:
            hit = _compiled.get(key)
    if hit is not None:
        stats["reused"] += 1
        hit[0](consts, *args)
        return
    try:
        compiled = _compile(jaxpr, consts, args)
        with _lock:
            # The callbacks stay alive with the program, so their ids in the
            # key cannot be taken by other objects while it is cached.
            _compiled[key] = (compiled, cbs)
            while len(_compiled) > _MAX_PROGRAMS:
                _compiled.popitem(last=False)
    finally:
        if owner:
            with _lock:
                _building.pop(key, None)
            event.set()
    stats["compiled"] += 1
    compiled(consts, *args)


def install() -> bool:
    """Wrap jax's thread-program runner; False (and nothing changed) where
    this jax has no such function with the signature it had in 0.10.2, or
    where ``JAXINFER_TESTS_INTERPRET_MEMO=0``."""
    if os.environ.get("JAXINFER_TESTS_INTERPRET_MEMO", "1") == "0":
        return False
    try:
        from jax._src.pallas.mosaic.interpret import thread_map
    except ImportError:
        return False
    fn = getattr(thread_map, "_run_jaxpr", None)
    if fn is None or getattr(fn, "_memoized", False):
        return False
    params = list(inspect.signature(fn).parameters)
    if params[:2] != ["jaxpr", "consts"]:
        return False
    _run_jaxpr_once._memoized = True
    thread_map._run_jaxpr = _run_jaxpr_once
    return True
