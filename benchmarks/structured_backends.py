"""Compares grammar libraries on one tokenizer: grammar compile time (cold
and cached), host time of one token mask along a valid output of the
20-field nested schema, and which JSON Schema / regex / grammar features
each one accepts. One library per run (xgrammar needs torch; run it from an
environment that has it):

    python benchmarks/structured_backends.py --backend llguidance \
        --out benchmarks/results/structured-backends-llguidance-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from structured_schemas import GRAMMARS, JSON_FEATURES, NESTED_20, REGEX_FEATURES, instance_text


def _tokenizer(model: str):
    from jaxinfer.models import resolve_model
    from jaxinfer.tokenizer import load_tokenizer
    files = resolve_model(model)
    return load_tokenizer(files.tokenizer), files.config.vocab_size


class LLGuidance:
    def __init__(self, tok, vocab):
        import llguidance
        import llguidance.numpy as lln
        self.llg, self.lln = llguidance, lln
        self.vocab = vocab
        self.tok = llguidance.LLTokenizer(tok.backend_tokenizer.to_str(),
                                          n_vocab=vocab,
                                          eos_token=tok.eos_token_id)
        self.cache: dict = {}

    def compile(self, kind, spec):
        key = (kind, json.dumps(spec, sort_keys=True))
        if key in self.cache:
            return self.cache[key].deep_copy()
        M = self.llg.LLMatcher
        grammar = (M.grammar_from_json_schema(
            spec, defaults={"whitespace_flexible": False})
            if kind == "json" else M.grammar_from_regex(spec)
            if kind == "regex" else self.llg.grammar_from("grammar", spec))
        err = M.validate_grammar(grammar, self.tok)
        if err:
            raise ValueError(err)
        m = M(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        self.cache[key] = m
        return m.deep_copy()

    def bitmask(self):
        return self.lln.allocate_token_bitmask(1, self.vocab)

    def fill(self, m, mask):
        self.lln.fill_next_token_bitmask(m, mask, 0)

    def accept(self, m, t):
        return m.consume_token(t)


class XGrammar:
    def __init__(self, tok, vocab):
        import xgrammar as xgr
        self.xgr = xgr
        self.vocab = vocab
        info = xgr.TokenizerInfo.from_huggingface(tok.full, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=True)

    def compile(self, kind, spec):
        c = self.compiler
        g = (c.compile_json_schema(json.dumps(spec), any_whitespace=False)
             if kind == "json" else c.compile_regex(spec)
             if kind == "regex" else c.compile_grammar(spec))
        return self.xgr.GrammarMatcher(g)

    def bitmask(self):
        return self.xgr.allocate_token_bitmask(1, self.vocab)

    def fill(self, m, mask):
        m.fill_next_token_bitmask(mask, 0)

    def accept(self, m, t):
        return m.accept_token(t)


def _ms(f):
    t0 = time.perf_counter()
    out = f()
    return out, 1e3 * (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("llguidance", "xgrammar"),
                    required=True)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    tok, vocab = _tokenizer(a.model)
    cls = LLGuidance if a.backend == "llguidance" else XGrammar
    backend, setup_ms = _ms(lambda: cls(tok, vocab))
    _, cold_ms = _ms(lambda: backend.compile("json", NESTED_20))
    _, cached_ms = _ms(lambda: backend.compile("json", NESTED_20))
    ids = tok.encode(instance_text(), add_special_tokens=False)
    times, refused = [], None
    for _ in range(3):
        m = backend.compile("json", NESTED_20)
        mask = backend.bitmask()
        for i, t in enumerate(ids):
            t0 = time.perf_counter()
            backend.fill(m, mask)
            times.append(1e6 * (time.perf_counter() - t0))
            if not backend.accept(m, t):  # a valid instance's token refused
                refused = {"index": i, "prefix": tok.decode(ids[:i]),
                           "token": tok.decode([t])}
                break
    coverage = {}
    cases = ([("json", k, v) for k, v in JSON_FEATURES.items()]
             + [("regex", k, v) for k, v in REGEX_FEATURES.items()]
             + [("grammar", k, v) for k, v in GRAMMARS.items()])
    for kind, name, spec in cases:
        try:
            backend.compile(kind, spec)
            coverage[f"{kind}:{name}"] = "ok"
        except Exception as e:  # each library raises its own types
            coverage[f"{kind}:{name}"] = f"error: {str(e)[:160]}"
    result = {
        "backend": a.backend, "model": a.model, "vocab": vocab,
        "cpus": os.cpu_count(),
        "tokenizer_setup_ms": round(setup_ms, 1),
        "compile_nested20_cold_ms": round(cold_ms, 2),
        "compile_nested20_cached_ms": round(cached_ms, 3),
        "instance_tokens": len(ids),
        "instance_refused": refused,
        "mask_us_mean": round(statistics.mean(times), 1),
        "mask_us_p50": round(statistics.median(times), 1),
        "mask_us_p99": round(sorted(times)[int(0.99 * len(times))], 1),
        "coverage_ok": sum(v == "ok" for v in coverage.values()),
        "coverage_total": len(coverage),
        "coverage": coverage,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
